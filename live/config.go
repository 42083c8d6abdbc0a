package live

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/lm-warden/warden/hardware"
	"github.com/lm-warden/warden/internal/strictyaml"
	"github.com/lm-warden/warden/placement"
)

// Config is the proxy's configuration, read from YAML by [LoadConfig] or
// [ParseConfig]. The zero value of every optional field means "use the
// default" (see [Config.applyDefaults]); a parsed Config is validated.
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
	SessionKey string `yaml:"session_key"`
	// SessionStore shares session homes, conversations held and in-flight
	// counts between several proxies: redis://HOST:PORT/DB or rediss://
	// (TLS), with the password in the URL or in the environment variable
	// SessionStorePasswordEnv names. Empty: this proxy's own table. With a
	// store session_key is required (the same on every proxy), since ids
	// are stored HMAC-hashed. SessionStoreTimeout bounds one exchange on
	// the request path; default 5ms (see DefaultStoreTimeout). A reload
	// does not change these (restart for that).
	SessionStore            string   `yaml:"session_store"`
	SessionStorePasswordEnv string   `yaml:"session_store_password_env"`
	SessionStoreTimeout     Duration `yaml:"session_store_timeout"`

	Limits         Limits     `yaml:"limits"`
	Timeouts       Timeouts   `yaml:"timeouts"`
	ScrapeInterval Duration   `yaml:"scrape_interval"` // default 1s
	Journal        JournalCfg `yaml:"journal"`
	Models         []ModelCfg `yaml:"models"`
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
	// MaxConnections bounds the client connections open at once, idle
	// keep-alive ones included. At the bound the proxy stops accepting
	// (new connections wait in the kernel's backlog) until one closes,
	// logs it at ERROR, counts it and /healthz answers 503. Default: see
	// DefaultMaxConnections. Restart only.
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
	// a backend to its first output token (prefill and queueing included);
	// default 5m. StreamIdle bounds the wait for the next whole event of a
	// stream once its first token came (bytes that end no event are no
	// progress); default 60s. On expiry the client gets the API's error
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
	// session_ttl. Default 2m (a few agent turn gaps), at most session_ttl.
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
	// PrefillTokensPerS is how fast each replica computes the uncached
	// part of a prompt, in tokens per second, for spill_threshold: priced
	// (required with it): a number, the same for every replica, or
	// "metrics" to measure each replica's from its vLLM metrics (see
	// prefillMeter). Unused otherwise.
	PrefillTokensPerS PrefillRate `yaml:"prefill_tokens_per_s"`
}

// PrefillRate is a model's prefill_tokens_per_s: a fixed rate (PerS) or
// measured per replica (Metrics); neither when not given.
type PrefillRate struct {
	PerS    float64
	Metrics bool
}

// Set reports whether the key was given.
func (r PrefillRate) Set() bool { return r.Metrics || r.PerS > 0 }

// maxPrefillTokensPerS bounds a configured prefill rate: a thousand times
// what an H200 computes (about 10^5 tokens/s for a small model), so a
// typo'd exponent is refused rather than taken.
const maxPrefillTokensPerS = 1e8

// UnmarshalYAML implements yaml.Unmarshaler.
func (r *PrefillRate) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && n.Value == "metrics" {
		*r = PrefillRate{Metrics: true}
		return nil
	}
	v, err := strconv.ParseFloat(n.Value, 64)
	if n.Kind != yaml.ScalarNode || err != nil || !(v > 0) || v > maxPrefillTokensPerS {
		return strictyaml.Bad(n, "want a prefill rate in tokens per second (a number above 0, at most %g) or metrics (measured on each replica from vLLM's metrics), got %q", float64(maxPrefillTokensPerS), n.Value)
	}
	*r = PrefillRate{PerS: v}
	return nil
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
		return "least-loaded"
	}
	if m.Strategy == "" {
		return "affinity"
	}
	return m.Strategy
}

// Toggle is a YAML on|off (also true|false) value; Set says it was given.
type Toggle struct{ On, Set bool }

// UnmarshalYAML implements yaml.Unmarshaler.
func (t *Toggle) UnmarshalYAML(n *yaml.Node) error {
	switch strings.ToLower(n.Value) {
	case "on", "true", "yes":
		*t = Toggle{On: true, Set: true}
	case "off", "false", "no":
		*t = Toggle{On: false, Set: true}
	default:
		return strictyaml.Bad(n, "want on or off, got %q", n.Value)
	}
	return nil
}

// Spill is a spill threshold: "auto" (Auto, a quarter of max_num_seqs),
// a number of in-flight requests, or "priced" (Priced, with Auto: a later
// turn leaves home when its expected time to first token there exceeds the
// one elsewhere; auto's number still bounds a subagent on its parent's
// home).
type Spill struct {
	N      int
	Auto   bool
	Priced bool
}

// UnmarshalYAML implements yaml.Unmarshaler.
// The rule is placement's (ParseSpillThreshold), shared with the planner
// and the simulator.
func (s *Spill) UnmarshalYAML(n *yaml.Node) error {
	t, err := placement.ParseSpillThreshold(n.Value)
	if err != nil {
		return strictyaml.Bad(n, "%v", err)
	}
	switch {
	case t.Priced():
		// It divides by each replica's prefill rate: validate requires
		// prefill_tokens_per_s with it.
		*s = Spill{Auto: true, Priced: true}
	case t.Auto():
		*s = Spill{Auto: true}
	default:
		*s = Spill{N: t.Resolve(0)}
	}
	return nil
}

// Duration is a time.Duration written as "1s", "30m".
type Duration time.Duration

// UnmarshalYAML implements yaml.Unmarshaler.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil || v < 0 {
		return strictyaml.Bad(n, "want a duration such as 1s or 30m, got %q", n.Value)
	}
	*d = Duration(v)
	return nil
}

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// ByteSize is a size in bytes written as a plain integer or with a suffix
// KiB, MiB, GiB (also KB, MB, GB as powers of 1000).
type ByteSize int64

var sizeRE = regexp.MustCompile(`^([0-9]+)\s*(|B|KB|MB|GB|KiB|MiB|GiB)$`)

// UnmarshalYAML implements yaml.Unmarshaler.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	m := sizeRE.FindStringSubmatch(strings.TrimSpace(n.Value))
	if m == nil {
		return strictyaml.Bad(n, "want a size such as 65536, 64KiB or 16MiB, got %q", n.Value)
	}
	v, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return strictyaml.Bad(n, "size %q: %v", n.Value, err)
	}
	mult := map[string]int64{"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m[2]]
	if v > math.MaxInt64/mult {
		return strictyaml.Bad(n, "size %q is too large", n.Value)
	}
	*b = ByteSize(v * mult)
	return nil
}

// Defaults used by applyDefaults.
const (
	DefaultAdmin          = "127.0.0.1:9091"
	DefaultMaxNumSeqs     = 256 // vLLM's default max_num_seqs
	DefaultMaxBodyBytes   = 16 << 20
	DefaultMaxHeaderBytes = 64 << 10
	DefaultMaxSessionID   = 256
	DefaultMaxSessions    = 1_000_000
	DefaultSessionTTL     = 30 * time.Minute
	DefaultActiveWindow   = placement.DefaultActiveWindow
	DefaultScrapeInterval = time.Second
	DefaultFirstToken     = 5 * time.Minute
	DefaultStreamIdle     = 60 * time.Second
	DefaultClientWrite    = 60 * time.Second
)

// DefaultMaxConnections is limits.max_connections when the configuration
// does not set it: half of the file descriptors the process may open
// (RLIMIT_NOFILE, which Go raises to its hard limit at start) after a
// reserve of a quarter of them, at most 1,024, for everything else (the
// admin listener, scrapes, the session store, the journal, idle
// connections to the replicas), since each client request in flight holds
// one connection to a replica too. 384 at the common 1,024; 4,096 where
// the limit cannot be read.
func DefaultMaxConnections() int {
	n := fdLimit()
	if n <= 0 {
		return 4096
	}
	reserve := min(1024, n/4)
	return int(min(max((n-reserve)/2, 16), math.MaxInt32))
}

// DefaultMaxInFlight is limits.max_in_flight when the configuration does
// not set it, sized for the machine: a quarter of its memory (MemTotal of
// /proc/meminfo, or of the cgroup's memory.max when lower) at 1 MiB per
// request, between 256 and 16,384. 1 MiB is an agent turn's body (a 58k-
// token conversation is ~250 KB of JSON) held once, plus the proxy's
// buffers and goroutine, with room to spare; a quarter leaves the rest to
// the Go heap's growth and to whatever else runs there. Where memory
// cannot be read: 4,096. At the cap the proxy still holds 16,384
// conversations in flight, far more than the replicas behind it run
// (vLLM's max_num_seqs is 256 to 1,024 each).
func DefaultMaxInFlight() int {
	mem := machineMemory()
	if mem <= 0 {
		return 4096
	}
	return int(min(max(mem/4/(1<<20), 256), 16384))
}

// machineMemory returns the memory this process may use in bytes, or 0.
func machineMemory() int64 {
	var total int64
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil {
					total = kb << 10
				}
			}
		}
	}
	if b, err := os.ReadFile("/sys/fs/cgroup/memory.max"); err == nil {
		if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && v > 0 && (total == 0 || v < total) {
			total = v
		}
	}
	return total
}

func (c *Config) applyDefaults() {
	def := func(d *Duration, v time.Duration) {
		if *d == 0 {
			*d = Duration(v)
		}
	}
	if c.Admin == "" {
		c.Admin = DefaultAdmin
	}
	if c.Auth == "" {
		c.Auth = "keys"
	}
	if c.Limits.MaxBodyBytes == 0 {
		c.Limits.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.Limits.MaxHeaderBytes == 0 {
		c.Limits.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.Limits.MaxSessionID == 0 {
		c.Limits.MaxSessionID = DefaultMaxSessionID
	}
	if c.Limits.MaxInFlight == 0 {
		c.Limits.MaxInFlight = DefaultMaxInFlight()
	}
	if c.Limits.MaxConnections == 0 {
		c.Limits.MaxConnections = DefaultMaxConnections()
	}
	def(&c.Timeouts.ReadHeader, 10*time.Second)
	def(&c.Timeouts.Read, 60*time.Second)
	def(&c.Timeouts.Idle, 120*time.Second)
	def(&c.Timeouts.Connect, 2*time.Second)
	def(&c.Timeouts.ResponseHeader, 10*time.Minute)
	def(&c.Timeouts.Health, 2*time.Second)
	def(&c.Timeouts.Drain, 60*time.Second)
	def(&c.Timeouts.FirstToken, DefaultFirstToken)
	def(&c.Timeouts.StreamIdle, DefaultStreamIdle)
	def(&c.Timeouts.ClientWrite, DefaultClientWrite)
	def(&c.ScrapeInterval, DefaultScrapeInterval)
	if c.Journal.MaxBytes == 0 {
		c.Journal.MaxBytes = 256 << 20
	}
	if c.Journal.Keep == 0 {
		c.Journal.Keep = 5
	}
	for i := range c.Models {
		m := &c.Models[i]
		if !m.SpillThreshold.Auto && m.SpillThreshold.N == 0 {
			m.SpillThreshold.Auto = true
		}
		def(&m.SessionTTL, DefaultSessionTTL)
		def(&m.ActiveWindow, min(DefaultActiveWindow, m.SessionTTL.D()))
		def(&m.AdmissionTimeout, DefaultAdmissionTimeout)
		if m.MaxSessions == 0 {
			m.MaxSessions = DefaultMaxSessions
		}
	}
}

// LoadConfig reads and validates the YAML file at path. Errors name the file,
// the line and the key, e.g. "proxy.yaml:12: models[0].replicas: ...".
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseConfig(filepath.Base(path), data)
}

// ParseConfig parses and validates a configuration; name is used in errors.
func ParseConfig(name string, data []byte) (*Config, error) {
	var cfg Config
	doc, err := strictyaml.Decode(name, data, &cfg)
	if err != nil {
		return nil, err
	}
	if doc.Empty() {
		return nil, fmt.Errorf("%s: empty configuration (want at least listen and models)", name)
	}
	cfg.applyDefaults()
	if err := cfg.validate(); err != nil {
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

func verr(path, format string, args ...any) error {
	return &validationError{path: path, msg: fmt.Sprintf(format, args...)}
}

func (c *Config) validate() error {
	if c.Listen == "" {
		return verr("listen", "required (e.g. 0.0.0.0:8080)")
	}
	switch c.Auth {
	case "keys":
		if len(c.ClientAPIKeys) == 0 {
			return verr("client_api_keys", "at least one key is required unless auth: passthrough is set")
		}
		for i, k := range c.ClientAPIKeys {
			if k == "" {
				return verr(fmt.Sprintf("client_api_keys[%d]", i), "empty key")
			}
		}
	case "passthrough":
		if len(c.ClientAPIKeys) > 0 {
			return verr("client_api_keys", "must be empty with auth: passthrough")
		}
	default:
		return verr("auth", "want keys or passthrough, got %q", c.Auth)
	}
	if c.TrustedPinHeader != "" && c.Auth != "keys" {
		return verr("trusted_pin_header", "needs auth: keys (with passthrough every client could pin a replica)")
	}
	if c.SessionStore != "" {
		if c.SessionKey == "" {
			return verr("session_key", "required with session_store (the same key on every proxy: ids are stored HMAC-hashed)")
		}
		if _, _, err := parseStoreURL(c.SessionStore, c.SessionStorePasswordEnv); err != nil {
			field := "session_store"
			if strings.HasPrefix(err.Error(), "session_store_password_env") {
				field = "session_store_password_env"
			}
			return verr(field, "%s", strings.TrimPrefix(strings.TrimPrefix(err.Error(), field+": "), "session_store: "))
		}
		if c.SessionStoreTimeout < 0 {
			return verr("session_store_timeout", "want a positive duration, got %s", c.SessionStoreTimeout.D())
		}
	} else if c.SessionStorePasswordEnv != "" || c.SessionStoreTimeout != 0 {
		return verr("session_store", "required with session_store_password_env or session_store_timeout")
	}
	if c.Limits.MaxBodyBytes < 1024 {
		return verr("limits.max_body_bytes", "at least 1KiB, got %d", c.Limits.MaxBodyBytes)
	}
	if c.Limits.MaxInFlight < 1 {
		return verr("limits.max_in_flight", "want a positive integer, got %d", c.Limits.MaxInFlight)
	}
	if c.Limits.MaxConnections < 1 {
		return verr("limits.max_connections", "want a positive integer, got %d", c.Limits.MaxConnections)
	}
	if c.Limits.MaxHeaderBytes < 1024 {
		return verr("limits.max_header_bytes", "at least 1KiB, got %d", c.Limits.MaxHeaderBytes)
	}
	if c.Timeouts.FirstToken.D() < 10*time.Millisecond {
		return verr("timeouts.first_token", "at least 10ms, got %s", c.Timeouts.FirstToken.D())
	}
	if c.Timeouts.StreamIdle.D() < 10*time.Millisecond {
		return verr("timeouts.stream_idle", "at least 10ms, got %s", c.Timeouts.StreamIdle.D())
	}
	if c.Timeouts.ClientWrite.D() < 10*time.Millisecond {
		return verr("timeouts.client_write", "at least 10ms, got %s", c.Timeouts.ClientWrite.D())
	}
	for i, h := range c.AdminHosts {
		if h == "" || strings.ContainsAny(h, ":/ ") {
			return verr(fmt.Sprintf("admin_hosts[%d]", i), "want a host name such as warden.internal (no port, no scheme), got %q", h)
		}
	}
	if c.ScrapeInterval.D() < 10*time.Millisecond {
		return verr("scrape_interval", "at least 10ms, got %s", c.ScrapeInterval.D())
	}
	if c.Journal.Path != "" && c.Journal.MaxBytes < 4096 {
		return verr("journal.max_bytes", "at least 4KiB, got %d", c.Journal.MaxBytes)
	}
	if len(c.Models) == 0 {
		return verr("models", "at least one model is required")
	}
	seen := map[string]bool{}
	for i := range c.Models {
		m := &c.Models[i]
		p := fmt.Sprintf("models[%d]", i)
		if m.Name == "" {
			return verr(p+".name", "required (the model name clients send)")
		}
		if seen[m.Name] {
			return verr(p+".name", "duplicate model %q", m.Name)
		}
		seen[m.Name] = true
		switch {
		case m.URL != "" && len(m.Replicas) > 0:
			return verr(p+".replicas", "give either url + data_parallel_size or replicas, not both")
		case m.URL == "" && len(m.Replicas) == 0:
			return verr(p, "needs url + data_parallel_size or a list of replicas")
		case m.URL != "":
			if err := checkURL(m.URL); err != nil {
				return verr(p+".url", "%v", err)
			}
			if m.DataParallelSize < 1 {
				return verr(p+".data_parallel_size", "want a positive integer with url, got %d", m.DataParallelSize)
			}
		default:
			if m.DataParallelSize != 0 {
				return verr(p+".data_parallel_size", "only with url (one server holding all ranks)")
			}
			for j, u := range m.Replicas {
				if err := checkURL(u); err != nil {
					return verr(fmt.Sprintf("%s.replicas[%d]", p, j), "%v", err)
				}
			}
		}
		if m.GPU != "" {
			if _, err := hardware.LookupGPU(m.GPU); err != nil {
				return verr(p+".gpu", "%v", err)
			}
		}
		if m.MaxNumSeqs < 0 {
			return verr(p+".max_num_seqs", "want a positive integer, got %d", m.MaxNumSeqs)
		}
		switch m.Strategy {
		case "", "affinity", "least-loaded", "hash":
		default:
			return verr(p+".strategy", "want affinity, least-loaded or hash, got %q", m.Strategy)
		}
		if m.Affinity.Set && m.Affinity.On && m.Strategy != "" && m.Strategy != "affinity" {
			return verr(p+".affinity", "affinity: on contradicts strategy %q", m.Strategy)
		}
		if m.MaxSessions < 1 {
			return verr(p+".max_sessions", "want a positive integer, got %d", m.MaxSessions)
		}
		if m.ActiveWindow > m.SessionTTL {
			return verr(p+".active_window", "%s is longer than session_ttl %s (a forgotten conversation is not active)", m.ActiveWindow.D(), m.SessionTTL.D())
		}
		if _, err := placement.ParseBalance(m.Balance); err != nil {
			return verr(p+".balance", "want sessions or kv, got %q", m.Balance)
		}
		if _, err := placement.ParseAdmission(m.Admission); err != nil {
			return verr(p+".admission", "want off or kv, got %q", m.Admission)
		}
		if m.SpillThreshold.Priced {
			if m.EffectiveStrategy() != placement.StrategyAffinity {
				return verr(p+".spill_threshold", "priced needs strategy affinity (it decides when a later turn leaves its home), got %s", m.EffectiveStrategy())
			}
			if !m.PrefillTokensPerS.Set() {
				return verr(p+".spill_threshold", "priced needs %s.prefill_tokens_per_s: the replicas' prefill rate in tokens per second, or metrics to measure it on each replica (from vllm:request_prefill_time_seconds and the prompt and prefix-cache counters)", p)
			}
		}
	}
	return nil
}

func checkURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("want an http(s)://host:port URL, got %q", s)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("no query or fragment allowed, got %q", s)
	}
	return nil
}
