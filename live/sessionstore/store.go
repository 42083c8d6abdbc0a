package sessionstore

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Store is the state several proxies share (config key
// session_store): each conversation's home with its idle TTL, the
// conversations held per replica, and every proxy's in-flight counts.
// Without one (the default) a proxy keeps its own table (placement.Table),
// which stays the local cache of homes in front of a store. placement
// never sees the store: it feeds the Snapshot and the table.
//
// Sessions arrive here already HMAC-hashed (session_key), never raw.
// Replicas are named by their target (URL, plus "#rank" for a rank of a
// data-parallel server), so proxies whose configs list them in another
// order still agree.
type Store interface {
	// Claim returns the home recorded for session, recording proposed
	// (with the TTL) when there is none, and whether one was recorded
	// before. It is atomic: proxies claiming one new session at once get
	// the same answer. One round trip. A key of the wrong type or size is
	// skipped (proposed is returned, counted in State).
	Claim(ctx context.Context, model, session, proposed string, ttl time.Duration) (home string, existed bool, err error)
	// Touch notes that session's home served it at now: its TTL is
	// refreshed and it counts as held there at the next sync, with no round
	// trip on the request path. A home first placed while the store was
	// down is recorded then (unless another proxy recorded one).
	Touch(model, session, home string, now time.Time)
	// Remote returns what the other proxies add to replica: their requests
	// in flight there, and the conversations held there by all proxies.
	// ok is false when the store has not synced recently.
	Remote(model, replica string) (inFlight, held int, ok bool)
	// Up reports whether the store is up: it answered once, and has not
	// been down since, or answered again over storeRiseFor (see storeFall).
	Up() bool
	// Down reports whether the store is known to be down: its exchanges
	// failed over storeFallFor without one success. A store neither up
	// nor down has not answered yet (a proxy just started): claims still
	// try it, so a restarted proxy finds the homes recorded before rather
	// than placing their conversations by rendezvous until its first sync.
	Down() bool
	// State describes the store for /api/status.
	State() Status
	// Run syncs with the store until ctx is done: it publishes local's
	// counts under a short lease, flushes touches and reads the others'
	// counts, every interval after a good sync and with a growing back-off
	// after failed ones.
	Run(ctx context.Context, local func() []Load)
	Close() error
}

// Load is one replica's local figures, published to the store.
type Load struct {
	Model, Replica string
	InFlight       int
	TTL, Window    time.Duration // the model's session TTL and active window
	// Cap is the most requests one proxy can hold on the replica
	// (limits.max_in_flight: a proxy holds no more in all): another
	// proxy's claim is trusted up to it. 0: maxTrustedInFlight.
	Cap int
}

// Status is the session store's state in /api/status.
type Status struct {
	URL       string    `json:"url"` // without credentials
	Up        bool      `json:"up"`
	LastError string    `json:"last_error,omitempty"`
	LastSync  time.Time `json:"last_sync,omitzero"`
	Changes   int64     `json:"state_changes"`   // changes between up and down since start
	Proxies   int       `json:"proxies"`         // proxies with a live lease, this one included
	Read      int       `json:"proxies_read"`    // other proxies whose counts the last sync read
	Pending   int       `json:"pending_touches"` // touches waiting for the next sync
	Dropped   int64     `json:"dropped_touches"` // touches dropped while the store was down (pending full)
	// BadKeys is the keys of the wrong type or size the last sync skipped;
	// BadKeysTotal counts every skip since start (each sync and claim that
	// met one; warden_session_store_bad_keys_total), and BadKey names the
	// last one met and what is wrong with it.
	BadKeys      int    `json:"bad_keys"`
	BadKeysTotal int64  `json:"bad_keys_total"`
	BadKey       string `json:"bad_key,omitempty"`
	// Capped is the other proxies' in-flight claims the last sync trusted
	// only up to this proxy's cap (Load.Cap) or found unreadable.
	Capped int `json:"capped_claims"`
	// Partial says what the last sync left out to stay within its bounds
	// (maxTouchesPerSync, maxStorePeers, maxPeerBytes); empty when it did
	// all of it.
	Partial string `json:"partial,omitempty"`
	// PublishMs and ReadMs time the last sync's two exchanges.
	PublishMs float64 `json:"publish_ms"`
	ReadMs    float64 `json:"read_ms"`
	// Mismatch says, while another proxy sharing the store lists other
	// replicas for a model this one serves, which: with the store down
	// they would place new conversations apart.
	Mismatch string `json:"replica_mismatch,omitempty"`
}

// Session-store defaults.
const (
	// DefaultTimeout bounds one exchange on the request path (a
	// claim): Redis on the same network answers in well under a
	// millisecond, so a few milliseconds means it is down or swamped, and
	// the proxy goes on without it.
	DefaultTimeout = 5 * time.Millisecond
	// storeInterval is how often counts are published and read. The
	// in-flight counts of other proxies are at most this old (plus the
	// exchange); a spill threshold sees a burst on the other proxy within
	// it.
	storeInterval = 100 * time.Millisecond
	// Lease is how long a proxy's published counts live without a
	// refresh: a dead proxy's in-flight requests stop counting after it.
	Lease = 2 * time.Second
	// storeBackoffMax caps the reconnect back-off while the store fails.
	storeBackoffMax = 5 * time.Second
	// The store goes down after storeFall failed exchanges (syncs and
	// claims) with no success between them spanning storeFallFor, and up
	// again after storeRise good ones with no failure between them
	// spanning storeRiseFor: hysteresis over time, as health checks have
	// (HAProxy's fall 3 / rise 2 at inter 2s), not over single probes. A
	// count alone flapped: at 4-5 ms round trips against the 5 ms
	// session_store_timeout, three claims in a row failed often and the
	// next sync succeeded, 14 up/down in 25 s (issue 46), each sending
	// new conversations to the rendezvous choice and back. A claim that
	// fails still falls back on its own. The first success of a store
	// not yet known up or down marks it up.
	storeFall    = 3
	storeFallFor = time.Second
	storeRise    = 3
	storeRiseFor = time.Second
	// maxPendingTouches bounds the touches kept while the store is down
	// (one per conversation: later touches of one session replace its
	// earlier one). Beyond it new conversations' touches are dropped and
	// counted; their homes stay in the local table and in rendezvous order.
	maxPendingTouches = 1 << 16
	// maxTouchesPerSync bounds the touches one sync records (3 commands
	// each); the rest wait for the next sync, storeInterval later: 40,000
	// a second, past any farm's new conversations, and a backlog of
	// maxPendingTouches after an outage is recorded in 1.6 s.
	maxTouchesPerSync = 4096
	// maxStorePeers bounds the other proxies whose counts one sync reads
	// (100,000 leases timed the sync out, issue 46); the leases read are
	// those ending first, and those that end more than Lease after
	// a lease of this proxy's would (a clock that far ahead, or not a
	// proxy's) are not read at all.
	maxStorePeers = 64
	// maxPeerFields bounds one proxy's published counts (a field per
	// replica it serves); a hash with more is skipped as a bad key.
	maxPeerFields = 4096
	// maxStoreName bounds a proxy id, a published field and a recorded
	// home: longer ones are skipped as bad.
	maxStoreName = 1024
	// maxPeerBytes bounds what one sync reads of the others' counts in
	// all; the peers past it are left for later syncs (Partial).
	maxPeerBytes = 16 << 20
	// maxTrustedInFlight is Load.Cap's default: the ceiling of
	// DefaultMaxInFlight.
	maxTrustedInFlight = 16384
)

// maxFails caps the count of failed exchanges in a row.
const maxFails = 1 << 20

// Redis is a Store in Redis.
//
// Keys (prefix warden:v1:):
//
//	home:<model>:<session>     string: the home replica's name; PX = session TTL
//	held:<model>:<replica>     sorted set: session -> last seen (ms); counted over the active window
//	load:<proxy>               hash: "<model>\x1f<replica>" -> in flight; PX = Lease
//	proxies                    sorted set: proxy -> lease deadline (ms)
//
// What the store answers is bounded twice: its scripts answer within
// bounds (maxStoreName, maxPeerFields, maxStorePeers, maxPeerBytes) and
// skip, naming and counting it, a key of the wrong type or size rather than
// fail the exchange; and every reply goes through replyGuard
// (storereply.go), so that a server that is not the Redis it should be
// cannot make the proxy hold more than maxStoreReply at once.
type Redis struct {
	rdb     *redis.Client
	url     string // redacted
	id      string // this proxy's id in the store
	timeout time.Duration
	now     func() time.Time
	log     *slog.Logger // up/down transitions; nil: none

	warming atomic.Bool    // a rewarm runs
	bg      sync.WaitGroup // the rewarm

	mu       sync.Mutex
	pending  map[touchKey]touch
	dropped  int64
	lastErr  string
	synced   time.Time
	last     syncReport // the last sync's figures
	badTotal int64
	badKey   string
	mismatch string // see Status.Mismatch

	// remote is the last sync's view of the others, read on every pick
	// without the lock.
	remote atomic.Pointer[remoteView]
	state  atomic.Int32 // storeUnknown, storeUp or storeDown
	fails  atomic.Int32 // failed exchanges in a row, up to maxFails

	hmu      sync.Mutex // the hysteresis below, and state's changes
	failedAt time.Time  // the first of the failures in a row
	oks      int        // good exchanges in a row, counted while down
	okAt     time.Time  // the first of them
	changes  int64
}

// syncReport is what one sync did, for /api/status.
type syncReport struct {
	proxies, read   int
	bad             map[string]string // key -> what is wrong with it
	capped          int
	partial         []string
	publish, readIn time.Duration
}

// A session store's state: unknown until its first exchange succeeds or
// it has failed as storeFall says.
const (
	storeUnknown int32 = iota
	storeUp
	storeDown
)

type touchKey struct{ model, session string }

type touch struct {
	home string
	seen time.Time
}

type remoteLoad struct{ inFlight, held int }

// remoteView is what one sync read: per "<model>\x1f<replica>", and when.
type remoteView struct {
	at    time.Time
	loads map[string]remoteLoad
}

// Prefix starts every key of the store (the layout is on Redis).
const Prefix = "warden:v1:"

// claimScript is Claim's atomic get-or-set: it returns {home, 0} when it
// recorded ARGV[1], {home, 1} when one was recorded, {ARGV[1], 2, why}
// when the key holds what no proxy records (another type, or a string
// longer than ARGV[3]): the claim skips it and the proxy keeps its choice.
var claimScript = redis.NewScript(`
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {ARGV[1], 0}
end
if t ~= 'string' then
  return {ARGV[1], 2, 'a ' .. t .. ', want a string'}
end
local n = redis.call('STRLEN', KEYS[1])
if n > tonumber(ARGV[3]) then
  return {ARGV[1], 2, 'a string of ' .. n .. ' bytes, want at most ' .. ARGV[3]}
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {redis.call('GET', KEYS[1]), 1}
`)

// presenceScript renews this proxy's lease (ARGV[1] until ARGV[2]) in the
// proxies set (KEYS[1]), drops the leases ended before ARGV[3] (now), and
// returns {'ok', live, ahead, long, id...}: the leases live, those ending
// after ARGV[4] (not read), the ids longer than ARGV[6] (skipped), and the
// ids of at most ARGV[5] leases ending first up to ARGV[4]. A set of the
// wrong type is left alone: {'bad', why}.
const presenceScript = `
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'zset' and t ~= 'none' then
  return {'bad', 'a ' .. t .. ', want a sorted set'}
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[3])
local out = {'ok', redis.call('ZCOUNT', KEYS[1], ARGV[3], '+inf'), redis.call('ZCOUNT', KEYS[1], '(' .. ARGV[4], '+inf'), 0}
local maxLen = tonumber(ARGV[6])
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[3], ARGV[4], 'LIMIT', 0, tonumber(ARGV[5]))) do
  if #id <= maxLen then out[#out + 1] = id else out[4] = out[4] + 1 end
end
return out
`

// loadsScript reads the other proxies' counts (KEYS: their load hashes):
// per hash {'ok', skipped, field, value...} with only the fields of the
// models in ARGV[5...] (this proxy's) and skipped the fields or values
// longer than ARGV[2] and ARGV[3]; {'bad', why} for a key of another type
// or with more than ARGV[1] fields; {'later'} once ARGV[4] bytes are read
// (those hashes are left for the next sync).
var loadsScript = redis.NewScript(`
local maxFields, maxField, maxValue, budget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local ours = {}
for i = 5, #ARGV do ours[ARGV[i]] = true end
local out = {}
for i, k in ipairs(KEYS) do
  local t = budget > 0 and redis.call('TYPE', k)['ok']
  if not t then
    out[i] = {'later'}
  elseif t == 'none' then
    out[i] = {'ok', 0}
  elseif t ~= 'hash' then
    out[i] = {'bad', 'a ' .. t .. ', want a hash'}
  else
    local n = redis.call('HLEN', k)
    if n > maxFields then
      out[i] = {'bad', 'a hash of ' .. n .. ' fields, want at most ' .. maxFields}
    else
      local kv = redis.call('HGETALL', k)
      local r = {'ok', 0}
      for j = 1, #kv, 2 do
        local f, v = kv[j], kv[j + 1]
        if #f > maxField or #v > maxValue then
          r[2] = r[2] + 1
        else
          local cut = string.find(f, '\31', 1, true)
          if cut and ours[string.sub(f, 1, cut - 1)] then
            r[#r + 1] = f
            r[#r + 1] = v
            budget = budget - #f - #v - 64
          end
        end
      end
      out[i] = r
    end
  end
end
return out
`)

// OpenRedis connects to the store at raw (redis:// or rediss://,
// database in the path, password in the URL or, when passwordEnv is set,
// in that environment variable). It does not wait for the server: a store
// that is down at start is retried by Run, and the proxy serves meanwhile.
// log (nil: none) hears of the store going down and up, and of proxies
// that list different replicas.
func OpenRedis(raw, passwordEnv string, timeout time.Duration, log *slog.Logger) (*Redis, error) {
	opt, redacted, err := ParseURL(raw, passwordEnv)
	if err != nil {
		return nil, err
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	// A claim is bounded by its context (timeout); a sync's round trip by
	// syncPhase: the store is judged by syncs that a round trip of a few
	// milliseconds does not fail, not by the request path's bound alone.
	opt.DialTimeout = max(timeout, 100*time.Millisecond)
	opt.ReadTimeout = syncPhase(timeout)
	opt.WriteTimeout = syncPhase(timeout)
	opt.ContextTimeoutEnabled = true
	opt.MaxRetries = -1 // a failed exchange is not retried on the request path: the proxy goes on without it
	opt.PoolSize = 64
	// RESP2: no push messages between replies, no client name sent.
	opt.Protocol = 2
	opt.DisableIdentity = true
	opt.Dialer = guardDialer(redis.NewDialer(opt), maxStoreReply)
	quietRedis.Do(func() { redis.SetLogger(discardRedisLog{}) })
	id, err := randomID()
	if err != nil {
		return nil, err
	}
	return &Redis{
		rdb:     redis.NewClient(opt),
		url:     redacted,
		id:      id,
		timeout: timeout,
		log:     log,
		now:     time.Now,
		pending: map[touchKey]touch{},
	}, nil
}

// quietRedis silences go-redis's own logger (process-wide; it prints dial
// failures on stderr): the store's state is in /api/status,
// warden_session_store_up and the proxy's log lines.
var quietRedis sync.Once

type discardRedisLog struct{}

func (discardRedisLog) Printf(context.Context, string, ...any) {}

// ParseURL checks a session_store URL and returns the client options
// and the URL without credentials.
func ParseURL(raw, passwordEnv string) (*redis.Options, string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, "", fmt.Errorf("session_store: %v", redactURLError(err))
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return nil, "", fmt.Errorf("session_store: scheme %q: want redis:// or rediss://", u.Scheme)
	}
	if u.Host == "" {
		return nil, "", errors.New("session_store: no host (want redis://HOST:PORT/DB)")
	}
	opt, err := redis.ParseURL(raw)
	if err != nil {
		return nil, "", fmt.Errorf("session_store: %v", redactURLError(err))
	}
	if passwordEnv != "" {
		pw, ok := os.LookupEnv(passwordEnv)
		if !ok {
			return nil, "", fmt.Errorf("session_store_password_env: environment variable %s is not set", passwordEnv)
		}
		opt.Password = pw
	}
	red := *u
	red.User = nil
	return opt, red.String(), nil
}

// redactURLError drops the URL (which may hold a password) from a parse
// error.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func randomID() (string, error) {
	host, _ := os.Hostname()
	var b [6]byte
	if _, err := crand.Read(b[:]); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s-%d-%x", host, os.Getpid(), b), nil
}

func homeKey(model, session string) string { return Prefix + "home:" + model + ":" + session }

// HeldKey is the sorted set of the sessions held on a model's replica.
func HeldKey(model, replica string) string { return Prefix + "held:" + model + ":" + replica }

// LoadField is a replica's field in a proxy's load hash.
func LoadField(model, replica string) string { return model + "\x1f" + replica }

// ProxiesKey is the sorted set of the proxies' lease deadlines.
const ProxiesKey = Prefix + "proxies"

func (s *Redis) loadKey(id string) string { return Prefix + "load:" + id }

// Claim implements Store.
func (s *Redis) Claim(ctx context.Context, model, session, proposed string, ttl time.Duration) (string, bool, error) {
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	key := homeKey(model, session)
	v, err := claimScript.Run(ctx, s.rdb, []string{key}, proposed, ttl.Milliseconds(), maxStoreName).Slice()
	if err != nil {
		if parent.Err() == nil { // the client leaving says nothing of the store
			s.failed(err)
			s.rewarm()
		}
		return "", false, err
	}
	var home string
	var code int64 = -1
	if len(v) >= 2 {
		home, _ = v[0].(string)
		code, _ = v[1].(int64)
	}
	if code < 0 || code > 2 {
		err := fmt.Errorf("session store: a claim answered %d values, not a home", len(v))
		s.failed(err)
		return "", false, err
	}
	s.succeeded()
	if code == 2 {
		why, _ := v[len(v)-1].(string)
		s.skipped(map[string]string{key: why})
		return proposed, false, nil
	}
	return home, code == 1, nil
}

// Touch implements Store.
func (s *Redis) Touch(model, session, home string, now time.Time) {
	k := touchKey{model, session}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.pending[k]; !ok && len(s.pending) >= maxPendingTouches {
		s.dropped++
		return
	}
	s.pending[k] = touch{home: home, seen: now}
}

// Remote implements Store. inFlight is at most maxStorePeers
// times a replica's Cap.
func (s *Redis) Remote(model, replica string) (int, int, bool) {
	v := s.remote.Load()
	if v == nil || !s.Up() || s.now().Sub(v.at) > Lease {
		return 0, 0, false
	}
	r := v.loads[LoadField(model, replica)]
	return r.inFlight, r.held, true
}

// Up implements Store.
func (s *Redis) Up() bool { return s.state.Load() == storeUp }

// Down implements Store.
func (s *Redis) Down() bool { return s.state.Load() == storeDown }

// State implements Store.
func (s *Redis) State() Status {
	s.hmu.Lock()
	changes := s.changes
	s.hmu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.last
	return Status{URL: s.url, Up: s.Up(), LastError: s.lastErr, LastSync: s.synced, Changes: changes,
		Proxies: l.proxies, Read: l.read, Pending: len(s.pending), Dropped: s.dropped,
		BadKeys: len(l.bad), BadKeysTotal: s.badTotal, BadKey: s.badKey, Capped: l.capped,
		Partial: strings.Join(l.partial, "; "), PublishMs: millis(l.publish), ReadMs: millis(l.readIn), Mismatch: s.mismatch}
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// succeeded counts a good exchange: the store is up at once unless it is
// down, then after storeRise good exchanges in a row spanning storeRiseFor.
func (s *Redis) succeeded() {
	if s.state.Load() == storeUp && s.fails.Load() == 0 {
		return // the request path's common case: no lock
	}
	s.hmu.Lock()
	defer s.hmu.Unlock()
	s.fails.Store(0)
	now := s.now()
	if s.oks == 0 {
		s.okAt = now
	}
	s.oks++
	switch s.state.Load() {
	case storeUnknown:
		s.setState(storeUp, nil)
	case storeDown:
		if s.oks >= storeRise && now.Sub(s.okAt) >= storeRiseFor {
			s.setState(storeUp, nil)
		}
	}
}

// failed counts a failed exchange: the store is down after storeFall
// failures in a row spanning storeFallFor.
func (s *Redis) failed(err error) {
	s.hmu.Lock()
	now := s.now()
	s.oks = 0
	if s.fails.Load() == 0 {
		s.failedAt = now
	}
	n := min(s.fails.Load()+1, maxFails) // hmu held: fails' only writers do
	s.fails.Store(n)
	if s.state.Load() != storeDown && n >= storeFall && now.Sub(s.failedAt) >= storeFallFor {
		s.setState(storeDown, err)
	}
	s.hmu.Unlock()
	s.mu.Lock()
	s.lastErr = err.Error()
	s.mu.Unlock()
}

// setState changes the store's state and logs it. Called with hmu held.
func (s *Redis) setState(to int32, err error) {
	if s.state.Swap(to) == to {
		return
	}
	s.changes++
	if s.log == nil {
		return
	}
	if to == storeDown {
		s.log.Warn("session store down: serving from this proxy's table, new sessions by rendezvous hash", "store", s.url, "err", err)
	} else {
		s.log.Info("session store up", "store", s.url)
	}
}

// skipped counts the keys of the wrong type or size an exchange left
// alone (key -> what is wrong with it).
func (s *Redis) skipped(bad map[string]string) {
	if len(bad) == 0 {
		return
	}
	first := slices.Min(slices.Collect(maps.Keys(bad)))
	s.mu.Lock()
	s.badTotal += int64(len(bad))
	s.badKey = first + " is " + bad[first]
	s.mu.Unlock()
}

// Run implements Store.
func (s *Redis) Run(ctx context.Context, local func() []Load) {
	wait := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			s.leave()
			return
		case <-time.After(wait):
		}
		wait = s.step(ctx, local, wait)
	}
}

// step is one sync of Run; it returns the wait before
// the next: storeInterval after a good sync, a growing back-off after a
// failed one.
func (s *Redis) step(ctx context.Context, local func() []Load, wait time.Duration) time.Duration {
	switch err := s.sync(ctx, local()); {
	case err != nil && ctx.Err() != nil:
		return wait
	case err != nil:
		return min(max(2*wait, storeInterval), storeBackoffMax)
	}
	return storeInterval
}

// leave withdraws this proxy's counts at shutdown, so the others stop
// counting its requests at once rather than when its lease ends.
func (s *Redis) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), 50*s.timeout)
	defer cancel()
	pipe := s.rdb.TxPipeline()
	pipe.Del(ctx, s.loadKey(s.id))
	pipe.ZRem(ctx, ProxiesKey, s.id)
	_, _ = pipe.Exec(ctx)
}

// sync is one sync with the store, counted as one exchange (succeeded,
// failed), in two round trips off the request path, each under its own
// deadline and timed (Status.PublishMs, ReadMs): publish records at
// most maxTouchesPerSync touches, publishes the local in-flight counts and
// this proxy's lease, counts the held conversations and lists the other
// proxies; read reads their counts. A key of the wrong type or size is
// skipped and counted, not a failure.
func (s *Redis) sync(ctx context.Context, loads []Load) error {
	err := s.exchange(ctx, loads)
	switch {
	case err != nil && ctx.Err() != nil: // the proxy stopping says nothing of the store
	case err != nil:
		s.failed(err)
	default:
		s.succeeded()
	}
	return err
}

func (s *Redis) exchange(ctx context.Context, loads []Load) error {
	now := s.now()
	rep := syncReport{bad: map[string]string{}}
	touches, left := s.takeTouches(maxTouchesPerSync)
	if left > 0 {
		rep.partial = append(rep.partial, fmt.Sprintf("%d touches wait for the next sync (%d a sync)", left, maxTouchesPerSync))
	}
	phase := syncPhase(s.timeout)
	start := time.Now()
	peers, held, err := s.publish(ctx, phase, now, loads, touches, &rep)
	rep.publish = time.Since(start)
	if err != nil {
		s.requeue(touches)
		return fmt.Errorf("session store: publish: %w", err)
	}
	start = time.Now()
	others, err := s.read(ctx, phase, peers, loads, &rep)
	rep.readIn = time.Since(start)
	if err != nil {
		return fmt.Errorf("session store: read: %w", err)
	}
	remote := make(map[string]remoteLoad, len(loads))
	caps := make(map[string]int, len(loads))
	for i, l := range loads {
		f := LoadField(l.Model, l.Replica)
		remote[f] = remoteLoad{held: held[i]}
		caps[f] = l.Cap
		if l.Cap <= 0 {
			caps[f] = maxTrustedInFlight
		}
	}
	mismatch := ""
	for _, o := range others {
		if mismatch == "" {
			mismatch = replicaMismatch(loads, o)
		}
		for f, v := range o {
			limit, ok := caps[f]
			if !ok {
				continue // a replica this proxy does not serve
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 { // not a count (another version's?): not trusted, not ours to fail on
				rep.capped++
				continue
			}
			if n > limit {
				n = limit
				rep.capped++
			}
			r := remote[f]
			r.inFlight = satAdd(r.inFlight, n)
			remote[f] = r
		}
	}
	s.remote.Store(&remoteView{at: now, loads: remote})
	s.skipped(rep.bad)
	s.mu.Lock()
	s.synced = now
	s.last = rep
	s.lastErr = ""
	changed := mismatch != s.mismatch
	s.mismatch = mismatch
	s.mu.Unlock()
	if changed && s.log != nil {
		if mismatch != "" {
			s.log.Warn("proxies sharing the session store list different replicas: with the store down they place new conversations apart; give every proxy the same replicas", "store", s.url, "mismatch", mismatch)
		} else {
			s.log.Info("proxies sharing the session store list the same replicas again", "store", s.url)
		}
	}
	return nil
}

// syncPhase bounds each of a sync's round trips, for a store whose
// request-path exchanges are bounded by timeout.
func syncPhase(timeout time.Duration) time.Duration { return max(20*timeout, 250*time.Millisecond) }

// publish is sync's first round trip, one transaction; it returns the ids
// of the other proxies to read and the conversations held on each of
// loads.
func (s *Redis) publish(ctx context.Context, d time.Duration, now time.Time, loads []Load, touches map[touchKey]touch, rep *syncReport) (peers []string, held []int, err error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	ms := func(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }
	ttls := map[string]time.Duration{}
	for _, l := range loads {
		ttls[l.Model] = l.TTL
	}
	pipe := s.rdb.TxPipeline()
	for k, t := range touches {
		ttl, ok := ttls[k.model]
		if !ok {
			continue // the model is gone (a reload)
		}
		hk := homeKey(k.model, k.session)
		pipe.SetNX(ctx, hk, t.home, ttl)
		pipe.PExpire(ctx, hk, ttl)
		pipe.ZAdd(ctx, HeldKey(k.model, t.home), redis.Z{Score: float64(t.seen.UnixMilli()), Member: k.session})
	}
	lk := s.loadKey(s.id)
	pipe.Del(ctx, lk)
	fields := make([]any, 0, 2*len(loads))
	for _, l := range loads {
		fields = append(fields, LoadField(l.Model, l.Replica), l.InFlight)
	}
	if len(fields) > 0 {
		pipe.HSet(ctx, lk, fields...)
		pipe.PExpire(ctx, lk, Lease)
	}
	presence := pipe.Eval(ctx, presenceScript, []string{ProxiesKey},
		s.id, ms(now.Add(Lease)), ms(now), ms(now.Add(2*Lease)), maxStorePeers+1, maxStoreName)
	counts := make([]*redis.IntCmd, len(loads))
	for i, l := range loads {
		hk := HeldKey(l.Model, l.Replica)
		pipe.ZRemRangeByScore(ctx, hk, "-inf", "("+ms(now.Add(-l.TTL)))
		pipe.PExpire(ctx, hk, l.TTL)
		counts[i] = pipe.ZCount(ctx, hk, ms(now.Add(-l.Window)), "+inf")
	}
	cmds, err := pipe.Exec(ctx)
	if err != nil {
		if err := wrongTypes(cmds, rep.bad); err != nil {
			return nil, nil, err
		}
	}
	held = make([]int, len(loads))
	for i, c := range counts {
		held[i] = int(max(c.Val(), 0)) // 0 where the key was skipped
	}
	peers, err = s.peers(presence, rep)
	return peers, held, err
}

// peers reads presenceScript's answer into rep and returns the ids of the
// other proxies to read.
func (s *Redis) peers(presence *redis.Cmd, rep *syncReport) ([]string, error) {
	v, err := presence.Slice()
	if err != nil {
		return nil, nil // a WRONGTYPE, which wrongTypes counted
	}
	if len(v) == 2 && v[0] == "bad" {
		why, _ := v[1].(string)
		rep.bad[ProxiesKey] = why
		rep.partial = append(rep.partial, "no proxy's counts read: the proxies set is unreadable")
		return nil, nil
	}
	if len(v) < 4 || v[0] != "ok" {
		return nil, fmt.Errorf("the proxies set answered %d values, not a list", len(v))
	}
	live, _ := v[1].(int64)
	ahead, _ := v[2].(int64)
	long, _ := v[3].(int64)
	rep.proxies = int(live)
	peers := make([]string, 0, len(v)-4)
	for _, x := range v[4:] {
		if id, _ := x.(string); id != s.id {
			peers = append(peers, id)
		}
	}
	if ahead > 0 {
		rep.partial = append(rep.partial, fmt.Sprintf("not read: %d leases that end more than %s after this proxy's", ahead, Lease))
	}
	if long > 0 {
		rep.partial = append(rep.partial, fmt.Sprintf("not read: %d proxy ids longer than %d bytes", long, maxStoreName))
	}
	if int(live-ahead-long) > len(v)-4 || len(peers) > maxStorePeers {
		rep.partial = append(rep.partial, fmt.Sprintf("read %d of %d other proxies' counts (%d a sync at most)", min(len(peers), maxStorePeers), live-1, maxStorePeers))
		peers = peers[:min(len(peers), maxStorePeers)]
	}
	return peers, nil
}

// read is sync's second round trip: the counts the other proxies
// published for the models of loads.
func (s *Redis) read(ctx context.Context, d time.Duration, peers []string, loads []Load, rep *syncReport) ([]map[string]string, error) {
	if len(peers) == 0 || len(loads) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	keys := make([]string, len(peers))
	for i, p := range peers {
		keys[i] = s.loadKey(p)
	}
	args := []any{maxPeerFields, maxStoreName, 20, maxPeerBytes} // 20: the digits of an int64
	seen := map[string]bool{}
	for _, l := range loads {
		if !seen[l.Model] {
			seen[l.Model] = true
			args = append(args, l.Model)
		}
	}
	v, err := loadsScript.Run(ctx, s.rdb, keys, args...).Slice()
	if err != nil {
		return nil, err
	}
	if len(v) != len(keys) {
		return nil, fmt.Errorf("%d proxies' counts answered %d values", len(keys), len(v))
	}
	var out []map[string]string
	later := 0
	for i, x := range v {
		e, _ := x.([]any)
		status := ""
		if len(e) > 0 {
			status, _ = e[0].(string)
		}
		switch {
		case status == "later":
			later++
		case status == "bad" && len(e) == 2:
			why, _ := e[1].(string)
			rep.bad[keys[i]] = why
		case status == "ok" && len(e)%2 == 0:
			skipped, _ := e[1].(int64)
			rep.capped += int(skipped)
			m := make(map[string]string, len(e)/2-1)
			for j := 2; j < len(e); j += 2 {
				f, _ := e[j].(string)
				m[f], _ = e[j+1].(string)
			}
			out = append(out, m)
		default:
			return nil, fmt.Errorf("proxy %d of %d's counts answered %v", i+1, len(keys), e)
		}
	}
	rep.read = len(out)
	if later > 0 {
		rep.partial = append(rep.partial, fmt.Sprintf("left for later syncs: %d other proxies' counts (%d bytes a sync at most)", later, maxPeerBytes))
	}
	return out, nil
}

// wrongTypes notes in bad the keys that a transaction's commands found of
// the wrong type (WRONGTYPE: Redis ran the others) and returns the first
// other error, if any.
func wrongTypes(cmds []redis.Cmder, bad map[string]string) error {
	for _, c := range cmds {
		err := c.Err()
		if err == nil || errors.Is(err, redis.Nil) {
			continue
		}
		if !strings.HasPrefix(err.Error(), "WRONGTYPE") {
			return err
		}
		if args := c.Args(); len(args) > 1 {
			key, _ := args[1].(string)
			bad[key] = "of the wrong type for " + strings.ToUpper(c.Name())
		}
	}
	return nil
}

// satAdd adds two counts, at most math.MaxInt.
func satAdd(a, b int) int {
	if a > math.MaxInt-b {
		return math.MaxInt
	}
	return a + b
}

// takeTouches takes at most n pending touches, and returns how many are
// left.
func (s *Redis) takeTouches(n int) (map[touchKey]touch, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) <= n {
		t := s.pending
		s.pending = make(map[touchKey]touch, len(t))
		return t, 0
	}
	t := make(map[touchKey]touch, n)
	for k, v := range s.pending {
		if len(t) == n {
			break
		}
		t[k] = v
		delete(s.pending, k)
	}
	return t, len(s.pending)
}

// replicaMismatch compares this proxy's replicas (loads) with another
// proxy's, read from its published counts (fields "<model>\x1f<replica>"),
// for the models both serve; "" when they agree, else the first model that
// differs and what each lists that the other does not (sorted).
func replicaMismatch(loads []Load, theirs map[string]string) string {
	ours := map[string]map[string]bool{}
	for _, l := range loads {
		if ours[l.Model] == nil {
			ours[l.Model] = map[string]bool{}
		}
		ours[l.Model][l.Replica] = true
	}
	other := map[string]map[string]bool{}
	for f := range theirs {
		model, rep, ok := strings.Cut(f, "\x1f")
		if !ok || ours[model] == nil {
			continue // a model only the other serves
		}
		if other[model] == nil {
			other[model] = map[string]bool{}
		}
		other[model][rep] = true
	}
	models := slices.Sorted(maps.Keys(other))
	for _, m := range models {
		var onlyOurs, onlyTheirs []string
		for r := range ours[m] {
			if !other[m][r] {
				onlyOurs = append(onlyOurs, r)
			}
		}
		for r := range other[m] {
			if !ours[m][r] {
				onlyTheirs = append(onlyTheirs, r)
			}
		}
		if len(onlyOurs)+len(onlyTheirs) > 0 {
			slices.Sort(onlyOurs)
			slices.Sort(onlyTheirs)
			return fmt.Sprintf("model %s: only this proxy lists %v, another lists %v", m, onlyOurs, onlyTheirs)
		}
	}
	return ""
}

// requeue puts back the touches of a failed sync, unless a later touch of
// the same session came meanwhile, within maxPendingTouches.
func (s *Redis) requeue(touches map[touchKey]touch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, t := range touches {
		if _, ok := s.pending[k]; ok {
			continue
		}
		if len(s.pending) >= maxPendingTouches {
			s.dropped++
			continue
		}
		s.pending[k] = t
	}
}

// rewarm replaces, off the request path, the connection a failed claim
// cost: go-redis closes a connection whose reply is still pending, and the
// next claim on a new one paid its HELLO (and, the script not loaded yet,
// EVALSHA's NOSCRIPT before EVAL) within session_store_timeout, so that
// with round trips past half the timeout every claim failed once one had
// (TestStoreClaimsStayWarm: 40 of 40). It opens a connection into the pool
// and loads the claim's script there, bounded by syncPhase; one at a time.
func (s *Redis) rewarm() {
	if !s.warming.CompareAndSwap(false, true) {
		return
	}
	s.bg.Go(func() {
		defer s.warming.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), syncPhase(s.timeout))
		defer cancel()
		_ = claimScript.Load(ctx, s.rdb).Err() // a failure is the claims' and syncs' to count
	})
}

// Close implements Store: it closes the connections and waits for
// a rewarm still running.
func (s *Redis) Close() error {
	err := s.rdb.Close()
	s.bg.Wait()
	return err
}
