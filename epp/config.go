package epp

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/lm-warden/warden/live"
)

// ConfigOptions are what warden epp's command line adds to the rules of
// its configuration file.
type ConfigOptions struct {
	// Kubernetes: the endpoints are an InferencePool's ready pods, so the
	// models list no replicas and no url (warden epp --kubernetes).
	Kubernetes bool
	// SessionKey is the session_key read from a Secret (warden epp
	// --session-key-file); the file then must not carry one.
	SessionKey string
	// KeyLater accepts a session_store without a session_key: the key
	// comes at run from a Secret (warden epp --check without
	// --session-key-file). The configuration returned then has an empty
	// SessionKey.
	KeyLater bool
}

// LoadConfig reads the picker's configuration file (see ParseConfig).
func LoadConfig(path string, o ConfigOptions) (*live.Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseConfig(filepath.Base(path), data, o)
}

// ParseConfig reads the picker's configuration: the proxy's format and
// rules (live.ParseConfig), and the picker's own: every replica an
// endpoint the gateway can be told (CheckConfig), or none under
// o.Kubernetes (the pool's pods are); no placeholder session_key
// (issue 50, item 6: a ConfigMap's "change-me-..." would key every
// picker alike), and the key from o.SessionKey when given. Errors name
// the file, the line and the key.
func ParseConfig(name string, data []byte, o ConfigOptions) (*live.Config, error) {
	later := false
	cfg, err := live.ParseConfigWith(name, data, func(c *live.Config) error {
		if isPlaceholderKey(c.SessionKey) {
			return live.FieldError("session_key", fmt.Sprintf("%q is a placeholder: put a long random key in a Kubernetes Secret (or a file only the picker reads) and give it with --session-key-file, the same on every picker", c.SessionKey))
		}
		switch {
		case o.SessionKey != "" && c.SessionKey != "":
			return live.FieldError("session_key", "given twice, here and by --session-key-file: leave it out of the file")
		case o.SessionKey != "":
			c.SessionKey = o.SessionKey
		case o.KeyLater && c.SessionStore != "" && c.SessionKey == "":
			later = true
			c.SessionKey = "key-given-at-run-by-session-key-file"
		}
		if o.Kubernetes {
			return poolModels(c)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if later {
		cfg.SessionKey = ""
	}
	if o.Kubernetes {
		for i := range cfg.Models {
			cfg.Models[i].Replicas = nil
		}
		return cfg, nil
	}
	if err := CheckConfig(cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return cfg, nil
}

// poolModels checks that no model lists its endpoints (the pool gives
// them) and gives each a placeholder replica to be validated with.
func poolModels(c *live.Config) error {
	for i := range c.Models {
		m := &c.Models[i]
		p := fmt.Sprintf("models[%d]", i)
		const why = "with --kubernetes the endpoints are the InferencePool's ready pods, one per pod and target port: leave url, data_parallel_size and replicas out"
		switch {
		case m.URL != "":
			return live.FieldError(p+".url", why)
		case m.DataParallelSize != 0:
			return live.FieldError(p+".data_parallel_size", why)
		case len(m.Replicas) > 0:
			return live.FieldError(p+".replicas", why)
		}
		m.Replicas = []string{poolPlaceholder}
	}
	return nil
}

// isPlaceholderKey reports a session_key that an example left to be
// replaced: change-me-..., replace-me, <...>.
func isPlaceholderKey(k string) bool {
	k = strings.ToLower(strings.TrimSpace(k))
	for _, p := range []string{"change-me", "changeme", "change_me", "replace-me", "replaceme", "replace_me", "<"} {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	return false
}

// MinSessionKey is the fewest bytes a session key read from a file may
// have: it keys the HMAC of every session id the pickers share.
const MinSessionKey = 16

// maxSessionKeyFile bounds what ReadSessionKey reads.
const maxSessionKeyFile = 4 << 10

// ReadSessionKey reads a session key from path (a Secret's key mounted
// as a file): its content, surrounding white space trimmed, at least
// MinSessionKey bytes and no placeholder.
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
	case isPlaceholderKey(key):
		return "", fmt.Errorf("--session-key-file %s: a placeholder key: put a long random one there", path)
	case len(key) < MinSessionKey:
		return "", errors.New("--session-key-file " + path + fmt.Sprintf(": %d bytes: want at least %d (a long random string)", len(key), MinSessionKey))
	}
	return key, nil
}
