package live

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/lm-warden/warden/internal/strictyaml"
	"github.com/lm-warden/warden/placement"
)

// Config is the proxy's configuration, read from YAML by [LoadConfig] or
// [ParseConfig]. The zero value of every optional field means "use the
// default" (see [Config.resolve]); a parsed Config is validated.
type Config struct {
	Listen string `yaml:"listen"` // client listener, e.g. "0.0.0.0:8080"
	Admin  string `yaml:"admin"`  // /metrics, /api/status, /healthz; default 127.0.0.1:9091
	// AdminHosts are the host names, besides localhost (and *.localhost),
	// the host of Admin and this machine's host name, by which the admin
	// address may be reached: a request whose Host header names another
	// gets 403, so that a page in a browser cannot read /api/status
	// through DNS rebinding. IP addresses are always accepted.
	AdminHosts []string `yaml:"admin_hosts"`

	// Auth is "keys" (the default: a client must present one of
	// ClientAPIKeys) or "passthrough" (the client's credentials are
	// forwarded unchecked; must be chosen explicitly).
	Auth          string   `yaml:"auth"`
	ClientAPIKeys []string `yaml:"client_api_keys"`
	// BackendAPIKey, when set, replaces the client's credentials on the way
	// to vLLM (Authorization: Bearer ...).
	BackendAPIKey string `yaml:"backend_api_key"`
	// TrustedPinHeader names a header (e.g. X-Warden-Replica) by which an
	// authenticated client may pin a replica index. Empty (the default):
	// no header ever chooses a replica.
	TrustedPinHeader string `yaml:"trusted_pin_header"`
	// SessionKey keys the HMAC applied to session ids before they are stored,
	// logged or journaled. Empty: a random key per process (hashes then
	// differ between runs; set a key to correlate journals across restarts).
	// A placeholder (change-me-..., <...>) is refused; best kept out of the
	// file and given with --session-key-file (sessionkey.go).
	SessionKey string `yaml:"session_key"`
	// SessionStore shares session homes, conversations held and in-flight
	// counts between several proxies: redis://HOST:PORT/DB or rediss://
	// (TLS), with the password in the URL or in the environment variable
	// SessionStorePasswordEnv names. Empty: this proxy's own table. With a
	// store session_key is required (the same on every proxy), since ids
	// are stored HMAC-hashed. SessionStoreTimeout bounds one exchange on
	// the request path; default 5ms (see sessionstore.DefaultTimeout). A reload
	// does not change these (restart for that).
	SessionStore            string   `yaml:"session_store"`
	SessionStorePasswordEnv string   `yaml:"session_store_password_env"`
	SessionStoreTimeout     Duration `yaml:"session_store_timeout"`

	Limits         Limits     `yaml:"limits"`
	Timeouts       Timeouts   `yaml:"timeouts"`
	ScrapeInterval Duration   `yaml:"scrape_interval"` // default 1s
	Journal        JournalCfg `yaml:"journal"`
	Models         []ModelCfg `yaml:"models"`

	// keyLater: session_key is to come from --session-key-file at run
	// (KeyOptions.Later); a store without one is accepted.
	keyLater bool
}

// Limits bound what a client may send.
type Limits struct {
	MaxBodyBytes   ByteSize `yaml:"max_body_bytes"`   // default 16 MiB; larger bodies get 413
	MaxHeaderBytes ByteSize `yaml:"max_header_bytes"` // default 64 KiB; Go's server answers 431 itself
	MaxSessionID   int      `yaml:"max_session_id"`   // default 256 bytes; longer ids get 400
	// MaxInFlight bounds the requests the whole proxy holds at once (body
	// read, waiting for or streaming a backend's answer). Beyond it a
	// request is answered at once, before its body is read: 429
	// rate_limit_error (OpenAI shapes) or 529 overloaded_error (Anthropic),
	// with Retry-After. Default: see DefaultMaxInFlight.
	MaxInFlight int `yaml:"max_in_flight"`
	// MaxBodyBytesInFlight bounds the bytes of request bodies the whole
	// proxy holds at once (each body counted by the buffer it is read
	// into, from its first byte until the replica answers). A request whose
	// body would take the proxy past it is answered at once: 429
	// rate_limit_error (OpenAI shapes) or 529 overloaded_error
	// (Anthropic) with Retry-After while other bodies hold the room, 413
	// when the body alone is larger. Default: see
	// DefaultMaxBodyBytesInFlight.
	MaxBodyBytesInFlight ByteSize `yaml:"max_body_bytes_in_flight"`
	// MaxConnections bounds the client connections served at once, idle
	// keep-alive ones included. At the bound a new connection is answered
	// at once, as MaxInFlight is (429/529 with Retry-After, and
	// Connection: close), or closed at once when many are being answered;
	// the proxy logs it at ERROR, counts it and /healthz answers 503.
	// Default: see DefaultMaxConnections. Restart only.
	MaxConnections int `yaml:"max_connections"`
}

// Timeouts bound slow clients and slow backends.
type Timeouts struct {
	ReadHeader     Duration `yaml:"read_header"`     // default 10s
	Read           Duration `yaml:"read"`            // whole request incl. body; default 60s
	Idle           Duration `yaml:"idle"`            // keep-alive idle; default 120s
	Connect        Duration `yaml:"connect"`         // dial to a backend; default 2s
	ResponseHeader Duration `yaml:"response_header"` // backend's headers; default 10m (long prefills)
	Health         Duration `yaml:"health"`          // /health and /metrics probes; default 2s
	Drain          Duration `yaml:"drain"`           // SIGTERM: finish streams up to this; default 60s
	// FirstToken bounds a streamed request from the moment it is sent to
	// a backend to its first output (prefill and queueing included): the
	// first event vLLM sends only with it (the role chunk, message_start,
	// a Responses event after response.created and response.in_progress;
	// see streamWatch); default 5m. StreamIdle bounds the wait for the
	// next whole event of a stream from then on (bytes that end no event
	// are no progress); default 60s. On expiry the client gets the API's error
	// event (or a 504 before any byte of a reply that is not an event
	// stream), the backend
	// request is cancelled and the replica takes a strike towards
	// ejection. A reply that is not an event stream (a JSON answer, a
	// stream's error) must arrive whole within stream_idle of waiting for
	// the replica after its headers (the time spent writing it to the
	// client is not counted), an event stream sent to a request that did
	// not ask for one may wait at most stream_idle for each event, and an
	// event stream the replica encoded (Content-Encoding) for each read:
	// every reply is timed to its end, with the same consequences.
	FirstToken Duration `yaml:"first_token"`
	StreamIdle Duration `yaml:"stream_idle"`
	// ClientWrite bounds a write to a client that makes no progress (a
	// client that stopped reading: its receive window is zero); default
	// 60s. On expiry the exchange ends, the backend request is cancelled,
	// and the cut is logged and counted (warden_client_write_timeouts_total).
	ClientWrite Duration `yaml:"client_write"`
}

// JournalCfg configures the optional request journal.
type JournalCfg struct {
	Path     string   `yaml:"path"`      // empty: no journal
	MaxBytes ByteSize `yaml:"max_bytes"` // rotate when a file would exceed this; default 256 MiB
	Keep     int      `yaml:"keep"`      // rotated files kept; default 5
}

// ModelCfg is one served model and its replicas, given either as one
// data-parallel vLLM server (URL + DataParallelSize, a rank reached with the
// X-data-parallel-rank header) or as one URL per replica (Replicas).
type ModelCfg struct {
	Name             string   `yaml:"name"`
	URL              string   `yaml:"url"`
	DataParallelSize int      `yaml:"data_parallel_size"`
	Replicas         []string `yaml:"replicas"`
	// MaxNumSeqs is vLLM's max_num_seqs per replica. 0: read it from the
	// server's *_config_info metrics when present, else vLLM's default 256.
	MaxNumSeqs int `yaml:"max_num_seqs"`
	// GPU is the replicas' GPU as the hardware catalogue names it ("H100",
	// "RTX A4000"), optional. When max_num_seqs is neither configured nor
	// exposed by the server (llm-d-inference-sim, other engines), vLLM's
	// default for that GPU is assumed: 1024 on >= 70 GiB GPUs other than
	// the A100, else 256.
	GPU            string   `yaml:"gpu"`
	Strategy       string   `yaml:"strategy"` // affinity (default), least-loaded, hash
	Affinity       Toggle   `yaml:"affinity"` // off: same as strategy least-loaded
	SpillThreshold Spill    `yaml:"spill_threshold"`
	SessionTTL     Duration `yaml:"session_ttl"`  // idle TTL of a session; default 30m
	MaxSessions    int      `yaml:"max_sessions"` // table cap (LRU eviction); default 1,000,000
	// ActiveWindow is how recently a conversation must have sent a request
	// to count as active: new conversations are balanced by the active
	// conversations a replica holds, while a quiet one keeps its home for
	// session_ttl. Unset, it is learned from the gaps between the
	// conversations' requests (placement/activity.go): at least 2m, longer
	// when sessions pause for minutes and come back; at most session_ttl.
	ActiveWindow Duration `yaml:"active_window"`
	// Balance is what affinity places new conversations by: sessions (the
	// default: the load score) or kv (the most KV headroom, capacity from
	// vllm:cache_config_info minus the footprints of the conversations held).
	Balance string `yaml:"balance"`
	// Admission, kv, makes a new conversation whose expected footprint fits
	// on no replica wait at the proxy (FIFO; conversations already admitted
	// never wait) until one ends or goes idle; off (the default) admits all.
	Admission string `yaml:"admission"`
	// AdmissionTimeout bounds that wait: beyond it the request is refused
	// with 429 (OpenAI) or 529 overloaded_error (Anthropic) and
	// Retry-After. Default 30s.
	AdmissionTimeout Duration `yaml:"admission_timeout"`
	// Rehome, cold, places the next turn of a conversation whose home
	// answered its last turn with (nearly) none of the prefix it had there
	// (the answer's cached tokens; vLLM reports them with
	// --enable-prompt-tokens-details) as a new conversation, reason
	// rehome; off (the default) keeps every conversation home.
	Rehome string `yaml:"rehome"`
	// Prefix, held, reads what each replica's KV cache holds of the prompt
	// from kv_events (placement/prefix.go): a conversation its home has
	// lost moves before its turn is sent, and one without a session id, or
	// a subagent, starts where its prefix already is; off (the default)
	// ignores it.
	Prefix string `yaml:"prefix"`
	// PrefillTokensPerS is how fast each replica computes the uncached
	// part of a prompt, in tokens per second, for spill_threshold: priced
	// (required with it): a number, the same for every replica, or
	// "metrics" to measure each replica's from its vLLM metrics (see
	// prefillMeter). Unused otherwise.
	PrefillTokensPerS PrefillRate `yaml:"prefill_tokens_per_s"`
	// KVEvents follows the replicas' vLLM KV-cache events (configkvevents.go).
	KVEvents KVEventsCfg `yaml:"kv_events"`
}

// DefaultAdmissionTimeout is the longest a new conversation waits for
// admission (admission: kv) before it is refused.
const DefaultAdmissionTimeout = 30 * time.Second

// Layout says how a model's replicas are reached.
type Layout int

const (
	LayoutURLs Layout = iota // one server per replica
	LayoutDP                 // one server, ranks chosen by X-data-parallel-rank
)

// Layout reports the model's replica layout.
func (m *ModelCfg) Layout() Layout {
	if m.URL != "" {
		return LayoutDP
	}
	return LayoutURLs
}

// NumReplicas is the number of replicas of the model.
func (m *ModelCfg) NumReplicas() int {
	if m.URL != "" {
		return m.DataParallelSize
	}
	return len(m.Replicas)
}

// EffectiveStrategy is the placement strategy after applying Affinity.
func (m *ModelCfg) EffectiveStrategy() string {
	if m.Affinity.Set && !m.Affinity.On {
		return placement.StrategyLeastLoaded
	}
	if m.Strategy == "" {
		return placement.StrategyAffinity
	}
	return m.Strategy
}

// LoadConfig reads and validates the YAML file at path. Errors name the file,
// the line and the key, e.g. "proxy.yaml:12: models[0].replicas: ...".
// A file over MaxConfigBytes is refused without being read whole.
func LoadConfig(path string) (*Config, error) {
	data, err := readConfigFile(path)
	if err != nil {
		return nil, err
	}
	return ParseConfig(filepath.Base(path), data)
}

// MaxConfigBytes bounds a configuration file: 1 MiB, what a Kubernetes
// ConfigMap may hold, and a hundred times a configuration of a thousand
// replicas. Issue 46 item 8: a 100 MB file was read whole and decoded
// before any check, and a reload of one left the proxy at 632 MB.
const MaxConfigBytes = 1 << 20

// readConfigFile reads the file at path, refusing one over MaxConfigBytes
// (by its size when it is a regular file, else after MaxConfigBytes + 1
// bytes): the error names the file.
func readConfigFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tooBig := func(size string) error {
		return fmt.Errorf("%s: %smore than the %d bytes (1 MiB) a configuration may have", path, size, MaxConfigBytes)
	}
	if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && fi.Size() > MaxConfigBytes {
		return nil, tooBig(fmt.Sprintf("%d bytes, ", fi.Size()))
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(data) > MaxConfigBytes {
		return nil, tooBig("")
	}
	return data, nil
}

// ParseConfig parses and validates a configuration; name is used in errors.
func ParseConfig(name string, data []byte) (*Config, error) {
	return ParseConfigWith(name, data, nil)
}

// ParseConfigWith is ParseConfig for a front end that finds some of the
// configuration itself (warden epp --kubernetes: the replicas are an
// InferencePool's pods): prepare, when not nil, sees the configuration as
// decoded, before it is validated, and may complete it. An error of
// prepare made by FieldError names the line of its key.
func ParseConfigWith(name string, data []byte, prepare func(*Config) error) (*Config, error) {
	var cfg Config
	doc, err := strictyaml.Decode(name, data, &cfg)
	if err != nil {
		return nil, err
	}
	if doc.Empty() {
		return nil, fmt.Errorf("%s: empty configuration (want at least listen and models)", name)
	}
	if prepare != nil {
		err = prepare(&cfg)
	}
	if err == nil {
		err = cfg.resolve()
	}
	if err != nil {
		var ve *validationError
		if errors.As(err, &ve) {
			return nil, doc.Errorf(ve.path, "%s", ve.msg)
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &cfg, nil
}

type validationError struct {
	path string // e.g. models[0].replicas
	msg  string
}

func (e *validationError) Error() string { return e.path + ": " + e.msg }

// FieldError is an error about the key at path (e.g. "models[0].replicas")
// that ParseConfigWith reports at the key's line.
func FieldError(path, msg string) error { return &validationError{path: path, msg: msg} }

func verr(path, format string, args ...any) error {
	return &validationError{path: path, msg: fmt.Sprintf(format, args...)}
}
