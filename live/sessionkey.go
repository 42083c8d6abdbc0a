package live

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// session_key is a secret: it keys the HMAC of every session id the
// proxies and pickers store, log and share. An example's placeholder left
// in a configuration (issue 50, item 6: a ConfigMap's "change-me-...")
// would key every deployment alike, so a placeholder is refused wherever
// a configuration is read (Config.resolve); the key is best kept out of
// the file altogether, in a file only warden reads (a Kubernetes Secret
// mounted as one, a systemd credential), given with --session-key-file
// (ReadSessionKey, KeyOptions).

// KeyOptions say where session_key comes from besides the configuration
// file: the command line's --session-key-file.
type KeyOptions struct {
	// Key is the key read from a file (ReadSessionKey); the configuration
	// then must not carry one.
	Key string
	// Later accepts a session_store without session_key: the key is to
	// come at run from a file (--check without --session-key-file). The
	// configuration returned then has an empty SessionKey.
	Later bool
}

// apply completes c with o's key, before c is validated.
func (o KeyOptions) apply(c *Config) error {
	if err := checkKey(c.SessionKey); err != nil {
		return err // before "given twice": the file's key is the fault
	}
	switch {
	case o.Key != "" && c.SessionKey != "":
		return verr("session_key", "given twice, here and by --session-key-file: leave it out of the file")
	case o.Key != "":
		c.SessionKey = o.Key
	case o.Later:
		c.keyLater = true
	}
	return nil
}

// ParseConfigKeyed is ParseConfigWith with session_key from o: the key
// read from a file, or none yet under o.Later.
func ParseConfigKeyed(name string, data []byte, o KeyOptions, prepare func(*Config) error) (*Config, error) {
	return ParseConfigWith(name, data, func(c *Config) error {
		if err := o.apply(c); err != nil {
			return err
		}
		if prepare != nil {
			return prepare(c)
		}
		return nil
	})
}

// LoadConfigKeyed is LoadConfig with session_key from o (see
// ParseConfigKeyed).
func LoadConfigKeyed(path string, o KeyOptions, prepare func(*Config) error) (*Config, error) {
	data, err := readConfigFile(path)
	if err != nil {
		return nil, err
	}
	return ParseConfigKeyed(filepath.Base(path), data, o, prepare)
}

// KeyToCome reports a configuration accepted under KeyOptions.Later
// whose session_store waits for its key from --session-key-file.
func (c *Config) KeyToCome() bool { return c.keyLater && c.SessionStore != "" && c.SessionKey == "" }

// placeholderKey reports a session_key that an example left to be
// replaced: change-me-..., replace-me, <...>.
func placeholderKey(k string) bool {
	k = strings.ToLower(strings.TrimSpace(k))
	for _, p := range []string{"change-me", "changeme", "change_me", "replace-me", "replaceme", "replace_me", "<"} {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	return false
}

// checkKey refuses a placeholder session_key.
func checkKey(k string) error {
	if placeholderKey(k) {
		return verr("session_key", "%q is a placeholder: %s", k, keyAdvice)
	}
	return nil
}

// keyAdvice is how to give a session key, for the errors that refuse one.
const keyAdvice = "put a long random key (head -c 32 /dev/urandom | base64) in a file only warden reads, such as a Kubernetes Secret mounted as one, and give it with --session-key-file, the same on every proxy and picker"

// MinSessionKey is the fewest bytes a session key read from a file may
// have: it keys the HMAC of every session id the proxies share.
const MinSessionKey = 16

// maxSessionKeyFile bounds what ReadSessionKey reads.
const maxSessionKeyFile = 4 << 10

// ReadSessionKey reads a session key from path (--session-key-file: a
// Kubernetes Secret's key mounted as a file, a systemd credential): its
// content, surrounding white space trimmed, at least MinSessionKey bytes
// and no placeholder.
func ReadSessionKey(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("--session-key-file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSessionKeyFile+1))
	if err != nil {
		return "", fmt.Errorf("--session-key-file %s: %w", path, err)
	}
	if len(data) > maxSessionKeyFile {
		return "", fmt.Errorf("--session-key-file %s: over %d bytes: want one key", path, maxSessionKeyFile)
	}
	key := strings.TrimSpace(string(data))
	switch {
	case placeholderKey(key):
		return "", fmt.Errorf("--session-key-file %s: a placeholder key: put a long random one there", path)
	case len(key) < MinSessionKey:
		return "", fmt.Errorf("--session-key-file %s: %d bytes: want at least %d (a long random string)", path, len(key), MinSessionKey)
	}
	return key, nil
}
