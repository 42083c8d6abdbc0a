package live

import (
	"fmt"
	"github.com/lm-warden/warden/live/sessionstore"
	"github.com/lm-warden/warden/live/upstream"
	"github.com/lm-warden/warden/metrics/vllm"
	"math"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/lm-warden/warden/hardware"
	"github.com/lm-warden/warden/placement"
)

// Defaults used by resolve.
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
	n := upstream.FDLimit()
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

// DefaultMaxBodyBytesInFlight is limits.max_body_bytes_in_flight when the
// configuration does not set it, sized for the machine: an eighth of its
// memory (machineMemory), between 64 MiB and 4 GiB, and never below
// limits.max_body_bytes (maxBody), so that the largest body a client may
// send always fits alone. The bodies' buffers are half of the quarter
// DefaultMaxInFlight sizes the requests from; the Go heap can grow to
// twice what is live. Where memory cannot be read: 1 GiB.
func DefaultMaxBodyBytesInFlight(maxBody int64) int64 {
	n := int64(1 << 30)
	if mem := machineMemory(); mem > 0 {
		n = min(max(mem/8, 64<<20), 4<<30)
	}
	return max(n, maxBody)
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

// resolve fills the defaults of every section and checks it, section by
// section in the order of the keys: the listener and the credentials, the
// session store, limits, timeouts, admin_hosts, scrape_interval, the
// journal, the models.
func (c *Config) resolve() error {
	if c.Admin == "" {
		c.Admin = DefaultAdmin
	}
	if c.Listen == "" {
		return verr("listen", "required (e.g. 0.0.0.0:8080)")
	}
	if err := checkListenAddrs(c.Listen, c.Admin); err != nil {
		return err
	}
	if err := c.resolveAuth(); err != nil {
		return err
	}
	if err := c.resolveStore(); err != nil {
		return err
	}
	if err := c.Limits.resolve(); err != nil {
		return err
	}
	if err := c.Timeouts.resolve(); err != nil {
		return err
	}
	for i, h := range c.AdminHosts {
		if h == "" || strings.ContainsAny(h, ":/ ") {
			return verr(fmt.Sprintf("admin_hosts[%d]", i), "want a host name such as warden.internal (no port, no scheme), got %q", h)
		}
	}
	defaultDuration(&c.ScrapeInterval, DefaultScrapeInterval)
	if c.ScrapeInterval.D() < 10*time.Millisecond {
		return verr("scrape_interval", "at least 10ms, got %s", c.ScrapeInterval.D())
	}
	if err := c.Journal.resolve(); err != nil {
		return err
	}
	if len(c.Models) == 0 {
		return verr("models", "at least one model is required")
	}
	seen := map[string]bool{}
	for i := range c.Models {
		m := &c.Models[i]
		p := fmt.Sprintf("models[%d]", i)
		if err := m.resolve(p, seen); err != nil {
			return err
		}
	}
	return nil
}

// defaultDuration sets *d to v when it is zero.
func defaultDuration(d *Duration, v time.Duration) {
	if *d == 0 {
		*d = Duration(v)
	}
}

// resolveAuth fills and checks auth, client_api_keys and
// trusted_pin_header.
func (c *Config) resolveAuth() error {
	if c.Auth == "" {
		c.Auth = "keys"
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
	return nil
}

// resolveStore checks session_key (no placeholder), session_store and the
// keys that go with it.
func (c *Config) resolveStore() error {
	if err := checkKey(c.SessionKey); err != nil {
		return err
	}
	if c.SessionStore == "" {
		if c.SessionStorePasswordEnv != "" || c.SessionStoreTimeout != 0 {
			return verr("session_store", "required with session_store_password_env or session_store_timeout")
		}
		return nil
	}
	if c.SessionKey == "" && !c.keyLater {
		return verr("session_key", "required with session_store (the same key on every proxy: ids are stored HMAC-hashed): give it with --session-key-file")
	}
	if _, _, err := sessionstore.ParseURL(c.SessionStore, c.SessionStorePasswordEnv); err != nil {
		field := "session_store"
		if strings.HasPrefix(err.Error(), "session_store_password_env") {
			field = "session_store_password_env"
		}
		return verr(field, "%s", strings.TrimPrefix(strings.TrimPrefix(err.Error(), field+": "), "session_store: "))
	}
	if c.SessionStoreTimeout < 0 {
		return verr("session_store_timeout", "want a positive duration, got %s", c.SessionStoreTimeout.D())
	}
	return nil
}

// resolve fills and checks the limits.
func (l *Limits) resolve() error {
	if l.MaxBodyBytes == 0 {
		l.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if l.MaxHeaderBytes == 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if l.MaxSessionID == 0 {
		l.MaxSessionID = DefaultMaxSessionID
	}
	if l.MaxInFlight == 0 {
		l.MaxInFlight = DefaultMaxInFlight()
	}
	if l.MaxConnections == 0 {
		l.MaxConnections = DefaultMaxConnections()
	}
	if l.MaxBodyBytes < 1024 {
		return verr("limits.max_body_bytes", "at least 1KiB, got %d", l.MaxBodyBytes)
	}
	if l.MaxBodyBytesInFlight == 0 {
		l.MaxBodyBytesInFlight = ByteSize(DefaultMaxBodyBytesInFlight(int64(l.MaxBodyBytes)))
	}
	if l.MaxBodyBytesInFlight < 1024 {
		return verr("limits.max_body_bytes_in_flight", "at least 1KiB, got %d", l.MaxBodyBytesInFlight)
	}
	if l.MaxInFlight < 1 {
		return verr("limits.max_in_flight", "want a positive integer, got %d", l.MaxInFlight)
	}
	if l.MaxConnections < 1 {
		return verr("limits.max_connections", "want a positive integer, got %d", l.MaxConnections)
	}
	if l.MaxHeaderBytes < 1024 {
		return verr("limits.max_header_bytes", "at least 1KiB, got %d", l.MaxHeaderBytes)
	}
	return nil
}

// resolve fills and checks the timeouts.
func (t *Timeouts) resolve() error {
	defaultDuration(&t.ReadHeader, 10*time.Second)
	defaultDuration(&t.Read, 60*time.Second)
	defaultDuration(&t.Idle, 120*time.Second)
	defaultDuration(&t.Connect, 2*time.Second)
	defaultDuration(&t.ResponseHeader, 10*time.Minute)
	defaultDuration(&t.Health, 2*time.Second)
	defaultDuration(&t.Drain, 60*time.Second)
	defaultDuration(&t.FirstToken, DefaultFirstToken)
	defaultDuration(&t.StreamIdle, DefaultStreamIdle)
	defaultDuration(&t.ClientWrite, DefaultClientWrite)
	if t.FirstToken.D() < 10*time.Millisecond {
		return verr("timeouts.first_token", "at least 10ms, got %s", t.FirstToken.D())
	}
	if t.StreamIdle.D() < 10*time.Millisecond {
		return verr("timeouts.stream_idle", "at least 10ms, got %s", t.StreamIdle.D())
	}
	if t.ClientWrite.D() < 10*time.Millisecond {
		return verr("timeouts.client_write", "at least 10ms, got %s", t.ClientWrite.D())
	}
	return nil
}

// resolve fills and checks the journal.
func (j *JournalCfg) resolve() error {
	if j.MaxBytes == 0 {
		j.MaxBytes = 256 << 20
	}
	if j.Keep == 0 {
		j.Keep = 5
	}
	if j.Path != "" && j.MaxBytes < 4096 {
		return verr("journal.max_bytes", "at least 4KiB, got %d", j.MaxBytes)
	}
	return nil
}

// resolve fills and checks one model, models[i] (p); seen holds the names
// of the models before it, and gets its own.
func (m *ModelCfg) resolve(p string, seen map[string]bool) error {
	if !m.SpillThreshold.Auto && m.SpillThreshold.N == 0 {
		m.SpillThreshold.Auto = true
	}
	defaultDuration(&m.SessionTTL, DefaultSessionTTL)
	// active_window unset stays 0: the table learns it from the gaps
	// between the conversations' requests (placement/activity.go), as the
	// simulator's does for a farm that leaves it unset.
	defaultDuration(&m.AdmissionTimeout, DefaultAdmissionTimeout)
	if m.MaxSessions == 0 {
		m.MaxSessions = DefaultMaxSessions
	}
	if m.Name == "" {
		return verr(p+".name", "required (the model name clients send)")
	}
	if seen[m.Name] {
		return verr(p+".name", "duplicate model %q", m.Name)
	}
	seen[m.Name] = true
	if err := m.checkBackends(p); err != nil {
		return err
	}
	if m.GPU != "" {
		if _, err := hardware.LookupGPU(m.GPU); err != nil {
			return verr(p+".gpu", "%v", err)
		}
	}
	if m.MaxNumSeqs < 0 || m.MaxNumSeqs > vllm.MaxServerNumSeqs {
		return verr(p+".max_num_seqs", "want a positive integer up to %d (the bound a server's own value is taken within), got %d", vllm.MaxServerNumSeqs, m.MaxNumSeqs)
	}
	if err := m.KVEvents.check(p, m.NumReplicas(), m.kvRanks()); err != nil {
		return err
	}
	return m.checkRouting(p)
}

// checkBackends checks url + data_parallel_size or replicas.
func (m *ModelCfg) checkBackends(p string) error {
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
	return nil
}

// checkRouting checks the strategy and its options.
func (m *ModelCfg) checkRouting(p string) error {
	if m.Strategy != "" {
		// The registry's names: the proxy serves some, the simulator all.
		st, ok := placement.LookupStrategy(m.Strategy)
		served := strings.Join(placement.ProxyStrategies(), ", ")
		switch {
		case !ok:
			return verr(p+".strategy", "want one of %s, got %q", served, m.Strategy)
		case !st.Proxy:
			return verr(p+".strategy", "%s runs in warden sim, plan and tune only; the proxy serves %s", m.Strategy, served)
		}
	}
	if m.Affinity.Set && m.Affinity.On && m.Strategy != "" && m.Strategy != placement.StrategyAffinity {
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
	if _, err := placement.ParseRehome(m.Rehome); err != nil {
		return verr(p+".rehome", "want off or cold, got %q", m.Rehome)
	}
	switch u, err := placement.ParsePrefixUse(m.Prefix); {
	case err != nil:
		return verr(p+".prefix", "want off or held, got %q", m.Prefix)
	case u == placement.PrefixHeld && !m.KVEvents.On():
		return verr(p+".prefix", "held reads what each replica holds from its KV events: set %s.kv_events", p)
	case u == placement.PrefixHeld && m.EffectiveStrategy() != placement.StrategyAffinity:
		return verr(p+".prefix", "held needs strategy affinity, got %s", m.EffectiveStrategy())
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
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("port %s of %q is not in 1-65535", p, s)
		}
	}
	return nil
}

// checkListenAddrs checks what net.Listen would refuse or what would make
// the second listener fail, so that --check says it before a start or a
// reload does: each address a host:port with a numeric or named port in
// 0-65535 (0: any free port), and listen and admin not on one socket (the
// same port where either host is a wildcard, or equal hosts).
func checkListenAddrs(listen, admin string) error {
	type addr struct {
		key, host string
		port      int
	}
	var as [2]addr
	for i, kv := range [2][2]string{{"listen", listen}, {"admin", admin}} {
		host, port, err := net.SplitHostPort(kv[1])
		if err != nil {
			return verr(kv[0], "want host:port (e.g. 0.0.0.0:8080), got %q: %v", kv[1], err)
		}
		n, err := strconv.Atoi(port)
		if err != nil {
			if n, err = net.LookupPort("tcp", port); err != nil {
				return verr(kv[0], "port %q of %q is neither a number nor a known service name", port, kv[1])
			}
		}
		if n < 0 || n > 65535 {
			return verr(kv[0], "port %d of %q is not in 0-65535", n, kv[1])
		}
		as[i] = addr{kv[0], host, n}
	}
	wild := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" || h == "[::]" }
	l, a := as[0], as[1]
	if l.port != 0 && l.port == a.port && (l.host == a.host || wild(l.host) || wild(a.host)) {
		return verr("admin", "%q and listen %q share port %d: the second listener could not start (give admin its own port, default %s)", admin, listen, a.port, DefaultAdmin)
	}
	return nil
}
