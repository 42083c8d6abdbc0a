package live

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"maps"
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

// sessionStore is the state several proxies share (config key
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
type sessionStore interface {
	// Claim returns the home recorded for session, recording proposed
	// (with the TTL) when there is none, and whether one was recorded
	// before. It is atomic: proxies claiming one new session at once get
	// the same answer. One round trip.
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
	// Up reports whether the last exchange with the store succeeded.
	Up() bool
	// Down reports whether the store is known to be down: storeFall
	// exchanges in a row failed. A store neither up nor down has not
	// answered yet (a proxy just started): claims still try it, so a
	// restarted proxy finds the homes recorded before rather than placing
	// their conversations by rendezvous until its first sync.
	Down() bool
	// State describes the store for /api/status.
	State() StoreStatus
	// Run syncs with the store until ctx is done: it publishes local's
	// counts under a short lease, flushes touches and reads the others'
	// counts, every interval while up and with a growing back-off while
	// down.
	Run(ctx context.Context, local func() []replicaLoad)
	Close() error
}

// replicaLoad is one replica's local figures, published to the store.
type replicaLoad struct {
	Model, Replica string
	InFlight       int
	TTL, Window    time.Duration // the model's session TTL and active window
}

// StoreStatus is the session store's state in /api/status.
type StoreStatus struct {
	URL       string    `json:"url"` // without credentials
	Up        bool      `json:"up"`
	LastError string    `json:"last_error,omitempty"`
	LastSync  time.Time `json:"last_sync,omitzero"`
	Proxies   int       `json:"proxies"`         // proxies with a live lease, this one included
	Pending   int       `json:"pending_touches"` // touches waiting for the next sync
	Dropped   int64     `json:"dropped_touches"` // touches dropped while the store was down (pending full)
	// Mismatch says, while another proxy sharing the store lists other
	// replicas for a model this one serves, which: with the store down
	// they would place new conversations apart.
	Mismatch string `json:"replica_mismatch,omitempty"`
}

// Session-store defaults.
const (
	// DefaultStoreTimeout bounds one exchange on the request path (a
	// claim): Redis on the same network answers in well under a
	// millisecond, so a few milliseconds means it is down or swamped, and
	// the proxy goes on without it.
	DefaultStoreTimeout = 5 * time.Millisecond
	// storeInterval is how often counts are published and read. The
	// in-flight counts of other proxies are at most this old (plus the
	// exchange); a spill threshold sees a burst on the other proxy within
	// it.
	storeInterval = 100 * time.Millisecond
	// storeLease is how long a proxy's published counts live without a
	// refresh: a dead proxy's in-flight requests stop counting after it.
	storeLease = 2 * time.Second
	// storeBackoffMax caps the reconnect back-off while the store is down.
	storeBackoffMax = 5 * time.Second
	// storeFall is the number of failed exchanges in a row (syncs and
	// claims) that mark the store down, as health checks do (HAProxy's
	// fall 3, healthFall): one exchange slower than the few milliseconds
	// of session_store_timeout on a loaded machine must not send every
	// new conversation to the rendezvous choice and back (issue 35: 14
	// flips in 80 s). A claim that fails still falls back on its own. One
	// good exchange marks it up.
	storeFall = 3
	// maxPendingTouches bounds the touches kept while the store is down
	// (one per conversation: later touches of one session replace its
	// earlier one). Beyond it new conversations' touches are dropped and
	// counted; their homes stay in the local table and in rendezvous order.
	maxPendingTouches = 1 << 16
)

// redisStore is a sessionStore in Redis.
//
// Keys (prefix warden:v1:):
//
//	home:<model>:<session>     string: the home replica's name; PX = session TTL
//	held:<model>:<replica>     sorted set: session -> last seen (ms); counted over the active window
//	load:<proxy>               hash: "<model>\x1f<replica>" -> in flight; PX = storeLease
//	proxies                    sorted set: proxy -> lease deadline (ms)
type redisStore struct {
	rdb     *redis.Client
	url     string // redacted
	id      string // this proxy's id in the store
	timeout time.Duration
	now     func() time.Time
	log     *slog.Logger // up/down transitions; nil: none

	mu       sync.Mutex
	pending  map[touchKey]touch
	dropped  int64
	lastErr  string
	synced   time.Time
	proxies  int
	mismatch string // see StoreStatus.Mismatch

	// remote is the last sync's view of the others, read on every pick
	// without the lock.
	remote atomic.Pointer[remoteView]
	state  atomic.Int32 // storeUnknown, storeUp or storeDown
	fails  atomic.Int32 // failed exchanges in a row (storeFall)
}

// A session store's state: unknown until its first exchange succeeds or
// storeFall fail in a row.
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

const storePrefix = "warden:v1:"

// claimScript is Claim's atomic get-or-set: it returns {home, existed}.
var claimScript = redis.NewScript(`
local h = redis.call('GET', KEYS[1])
if h then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {h, 1}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {ARGV[1], 0}
`)

// openRedisStore connects to the store at raw (redis:// or rediss://,
// database in the path, password in the URL or, when passwordEnv is set,
// in that environment variable). It does not wait for the server: a store
// that is down at start is retried by Run, and the proxy serves meanwhile.
func openRedisStore(raw, passwordEnv string, timeout time.Duration) (*redisStore, error) {
	opt, redacted, err := parseStoreURL(raw, passwordEnv)
	if err != nil {
		return nil, err
	}
	if timeout <= 0 {
		timeout = DefaultStoreTimeout
	}
	opt.DialTimeout = max(timeout, 100*time.Millisecond)
	opt.ReadTimeout = timeout
	opt.WriteTimeout = timeout
	opt.ContextTimeoutEnabled = true
	opt.MaxRetries = -1 // a failed exchange is not retried on the request path: the proxy goes on without it
	opt.PoolSize = 64
	quietRedis.Do(func() { redis.SetLogger(discardRedisLog{}) })
	id, err := randomID()
	if err != nil {
		return nil, err
	}
	return &redisStore{
		rdb:     redis.NewClient(opt),
		url:     redacted,
		id:      id,
		timeout: timeout,
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

// parseStoreURL checks a session_store URL and returns the client options
// and the URL without credentials.
func parseStoreURL(raw, passwordEnv string) (*redis.Options, string, error) {
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

func homeKey(model, session string) string   { return storePrefix + "home:" + model + ":" + session }
func heldKey(model, replica string) string   { return storePrefix + "held:" + model + ":" + replica }
func loadField(model, replica string) string { return model + "\x1f" + replica }

const proxiesKey = storePrefix + "proxies"

func (s *redisStore) loadKey(id string) string { return storePrefix + "load:" + id }

// Claim implements sessionStore.
func (s *redisStore) Claim(ctx context.Context, model, session, proposed string, ttl time.Duration) (string, bool, error) {
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	v, err := claimScript.Run(ctx, s.rdb, []string{homeKey(model, session)}, proposed, ttl.Milliseconds()).Slice()
	if err != nil {
		if parent.Err() == nil { // the client leaving says nothing of the store
			s.failed(err)
		}
		return "", false, err
	}
	if s.fails.Load() != 0 {
		s.fails.Store(0)
	}
	if s.state.Load() != storeUp {
		s.state.Store(storeUp)
	}
	if len(v) != 2 {
		err := fmt.Errorf("session store: claim answered %d values", len(v))
		s.failed(err)
		return "", false, err
	}
	home, _ := v[0].(string)
	existed, _ := v[1].(int64)
	return home, existed == 1, nil
}

// Touch implements sessionStore.
func (s *redisStore) Touch(model, session, home string, now time.Time) {
	k := touchKey{model, session}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.pending[k]; !ok && len(s.pending) >= maxPendingTouches {
		s.dropped++
		return
	}
	s.pending[k] = touch{home: home, seen: now}
}

// Remote implements sessionStore.
func (s *redisStore) Remote(model, replica string) (int, int, bool) {
	v := s.remote.Load()
	if v == nil || !s.Up() || s.now().Sub(v.at) > storeLease {
		return 0, 0, false
	}
	r := v.loads[loadField(model, replica)]
	return r.inFlight, r.held, true
}

// Up implements sessionStore.
func (s *redisStore) Up() bool { return s.state.Load() == storeUp }

// Down implements sessionStore.
func (s *redisStore) Down() bool { return s.state.Load() == storeDown }

// State implements sessionStore.
func (s *redisStore) State() StoreStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return StoreStatus{URL: s.url, Up: s.Up(), LastError: s.lastErr, LastSync: s.synced,
		Proxies: s.proxies, Pending: len(s.pending), Dropped: s.dropped, Mismatch: s.mismatch}
}

// failed counts a failed exchange, and marks the store down at the
// storeFall-th in a row.
func (s *redisStore) failed(err error) {
	if saturatingInc(&s.fails) >= storeFall {
		s.state.Store(storeDown)
	}
	s.mu.Lock()
	s.lastErr = err.Error()
	s.mu.Unlock()
}

// Run implements sessionStore.
func (s *redisStore) Run(ctx context.Context, local func() []replicaLoad) {
	wait := time.Duration(0)
	was := "unknown"
	for {
		select {
		case <-ctx.Done():
			s.leave()
			return
		case <-time.After(wait):
		}
		wait = s.step(ctx, local, wait, &was)
	}
}

// step is one sync of Run, its outcome counted and logged at a change of
// state; it returns the wait before the next: storeInterval while the
// store is up, a growing back-off while it is down.
func (s *redisStore) step(ctx context.Context, local func() []replicaLoad, wait time.Duration, was *string) time.Duration {
	err := s.sync(ctx, local())
	if err != nil && ctx.Err() != nil {
		return wait
	}
	if err != nil {
		s.failed(err)
	}
	state := "unknown" // failed, but fewer than storeFall times in a row yet
	switch {
	case s.Up():
		state = "up"
	case s.Down():
		state = "down"
	}
	if state != *was && s.log != nil {
		switch state {
		case "down":
			s.log.Warn("session store down: serving from this proxy's table, new sessions by rendezvous hash", "store", s.url, "err", err)
		case "up":
			s.log.Info("session store up", "store", s.url)
		}
	}
	*was = state
	if state != "up" {
		return min(max(2*wait, storeInterval), storeBackoffMax)
	}
	return storeInterval
}

// leave withdraws this proxy's counts at shutdown, so the others stop
// counting its requests at once rather than when its lease ends.
func (s *redisStore) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), 50*s.timeout)
	defer cancel()
	pipe := s.rdb.TxPipeline()
	pipe.Del(ctx, s.loadKey(s.id))
	pipe.ZRem(ctx, proxiesKey, s.id)
	_, _ = pipe.Exec(ctx)
}

// sync is one exchange with the store: flush the touches, publish the
// local in-flight counts, count the held conversations, then read the
// other proxies' counts. Two round trips, off the request path.
func (s *redisStore) sync(ctx context.Context, loads []replicaLoad) error {
	now := s.now()
	s.mu.Lock()
	touches := s.pending
	s.pending = make(map[touchKey]touch, len(touches))
	s.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, max(20*s.timeout, 250*time.Millisecond))
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
		pipe.ZAdd(ctx, heldKey(k.model, t.home), redis.Z{Score: float64(t.seen.UnixMilli()), Member: k.session})
	}
	lk := s.loadKey(s.id)
	pipe.Del(ctx, lk)
	fields := make([]any, 0, 2*len(loads))
	for _, l := range loads {
		fields = append(fields, loadField(l.Model, l.Replica), l.InFlight)
	}
	if len(fields) > 0 {
		pipe.HSet(ctx, lk, fields...)
		pipe.PExpire(ctx, lk, storeLease)
	}
	pipe.ZAdd(ctx, proxiesKey, redis.Z{Score: float64(now.Add(storeLease).UnixMilli()), Member: s.id})
	pipe.ZRemRangeByScore(ctx, proxiesKey, "-inf", "("+ms(now))
	alive := pipe.ZRangeByScore(ctx, proxiesKey, &redis.ZRangeBy{Min: ms(now), Max: "+inf"})
	held := make([]*redis.IntCmd, len(loads))
	for i, l := range loads {
		hk := heldKey(l.Model, l.Replica)
		pipe.ZRemRangeByScore(ctx, hk, "-inf", "("+ms(now.Add(-l.TTL)))
		pipe.PExpire(ctx, hk, l.TTL)
		held[i] = pipe.ZCount(ctx, hk, ms(now.Add(-l.Window)), "+inf")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		s.requeue(touches)
		return err
	}

	peers := alive.Val()
	read := s.rdb.Pipeline()
	var others []*redis.MapStringStringCmd
	for _, p := range peers {
		if p != s.id {
			others = append(others, read.HGetAll(ctx, s.loadKey(p)))
		}
	}
	if len(others) > 0 {
		if _, err := read.Exec(ctx); err != nil {
			return err
		}
	}
	remote := make(map[string]remoteLoad, len(loads))
	for i, l := range loads {
		remote[loadField(l.Model, l.Replica)] = remoteLoad{held: int(held[i].Val())}
	}
	mismatch := ""
	for _, o := range others {
		if mismatch == "" {
			mismatch = replicaMismatch(loads, o.Val())
		}
		for f, v := range o.Val() {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				continue // not ours to fail on: another version's field
			}
			r := remote[f]
			r.inFlight += n
			remote[f] = r
		}
	}
	s.remote.Store(&remoteView{at: now, loads: remote})
	s.mu.Lock()
	s.synced = now
	s.proxies = len(peers)
	s.lastErr = ""
	changed := mismatch != s.mismatch
	s.mismatch = mismatch
	s.mu.Unlock()
	s.fails.Store(0)
	s.state.Store(storeUp)
	if changed && s.log != nil {
		if mismatch != "" {
			s.log.Warn("proxies sharing the session store list different replicas: with the store down they place new conversations apart; give every proxy the same replicas", "store", s.url, "mismatch", mismatch)
		} else {
			s.log.Info("proxies sharing the session store list the same replicas again", "store", s.url)
		}
	}
	return nil
}

// replicaMismatch compares this proxy's replicas (loads) with another
// proxy's, read from its published counts (fields "<model>\x1f<replica>"),
// for the models both serve; "" when they agree, else the first model that
// differs and what each lists that the other does not (sorted).
func replicaMismatch(loads []replicaLoad, theirs map[string]string) string {
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
func (s *redisStore) requeue(touches map[touchKey]touch) {
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

// Close implements sessionStore.
func (s *redisStore) Close() error { return s.rdb.Close() }
