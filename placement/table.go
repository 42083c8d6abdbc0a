package placement

import (
	"math"
	"time"
)

// Defaults of the session table, used where a Config leaves a field zero.
const (
	// DefaultSessionTTL is how long a conversation keeps its home without
	// a request. Agent sessions pause for tool calls and for their user;
	// half an hour outlives those pauses but not a prefix cache under load.
	DefaultSessionTTL = 30 * time.Minute
	// DefaultMaxSessions is the hard cap on remembered conversations:
	// about 75 MB of table at the 75 bytes per session measured by
	// BenchmarkTableBytesPerSession.
	DefaultMaxSessions = 1 << 20
	// DefaultActiveWindow is how recently a conversation must have sent a
	// request to count as active, that is as load still to come, in the
	// per-replica figures that place new conversations. An agent turn gap
	// (a tool call, a short read by the user) is seconds to about a minute;
	// two minutes spans a few such gaps, so a working conversation never
	// drops out between its turns, while one that has finished stops
	// weighing on its replica within minutes rather than after the half
	// hour its home is kept for (DefaultSessionTTL).
	DefaultActiveWindow = 2 * time.Minute
)

// expireBatch bounds the lazy expiry done by each call: at most this many
// idle entries are dropped from the LRU tail per lookup. A call adds at most
// one entry, so the table catches up with any backlog of idle entries.
const expireBatch = 8

// nilIndex marks the end of the LRU list and of the free list.
const nilIndex int32 = -1

// ReplicaCounters are the table's per-replica figures. Sessions and Active
// are the conversations homed on the replica now; the other fields count
// decisions since the table was made.
//
// Sessions counts every conversation the replica is home to (within the
// TTL, give or take lazy expiry): a returning one is routed here. Active
// counts those among them seen within the active window: the
// conversations the replica is serving now. Placement balances new
// conversations by Active ("conversations held" means active ones); Fill
// writes Active into Replica.Sessions. Active <= Sessions.
type ReplicaCounters struct {
	Sessions     int // conversations homed here now, active or idle (kept incrementally)
	Active       int // of those, last seen within the active window (kept incrementally)
	New          int // new conversations placed here by the load score
	Parent       int // subagents' new conversations placed on their parent's home here
	Sticky       int // later turns served by their home, this replica
	SpilledIn    int // requests spilled here from an overloaded home
	ClientPinned int // requests a trusted client pinned here
	// Footprint is the sum, over the active conversations homed here, of
	// each one's footprint: its last prompt + answer tokens (Table.Observe;
	// the prompt of its latest request until then). Kept incrementally.
	Footprint int
	// Held counts the active conversations whose KV still counts against
	// the replica's headroom (admission and the KV balance, see "Held
	// conversations" below): a request of theirs is in flight, or their
	// turn ended less than their return timeout ago. HeldFootprint is the
	// sum of their footprints. Held <= Active; a caller that never reports
	// a request's end (Table.Finish) holds every active conversation, so
	// Held == Active and HeldFootprint == Footprint.
	Held          int
	HeldFootprint int
	// Rehomed counts the conversations that left this replica because it
	// was found cold for them (observed.go; Config.Rehome cold).
	Rehomed int
	// AskedTokens and CachedTokens sum, over the turns this replica served
	// as their conversation's home and whose answer reported its cached
	// tokens, the prompt tokens asked and those served from its prefix
	// cache (Table.ObserveHits): the observed hit rate of its homed
	// conversations.
	AskedTokens, CachedTokens int64
}

// entry is one remembered conversation. 32 bytes: the key, the time of its
// last request, its place in the LRU list, its home, and in the padding
// whether it is counted active and held, and its first home.
type entry struct {
	key    uint64 // fnv1a64 of the session id
	seen   int64  // last request, nanoseconds since Table.base
	prev   int32  // towards the head (more recent); nilIndex at the head
	next   int32  // towards the tail (less recent); also links the free list
	home   int32  // replica ID
	active bool   // counted in its home's Active: between head and Table.act
	held   bool   // counted in its home's Held (see "Held conversations"); implies active
	first  int16  // the replica it was first homed on (its first turn's); -1 past MaxInt16
}

// Table remembers the home replica of each conversation: session -> home,
// last seen. It has an idle TTL and a hard cap; on overflow it evicts the
// least-recently-used conversation and never refuses a new one. Time is
// always an argument.
//
// Memory: a session is stored as the 64-bit FNV-1a hash of its id, never
// as the id itself. Entries live in one slice, threaded by an intrusive
// doubly-linked LRU list of int32 indices and a free list, with a
// map[uint64]int32 as the index: under 100 bytes per session (see
// BenchmarkTableBytesPerSession). Two ids with the same hash share one
// entry, and so one home; with n live sessions the chance that any two
// collide is about n²/2⁶⁵ (3·10⁻⁸ for a million sessions), and the cost
// of a collision is only that two conversations share a replica.
//
// Expiry is lazy and cheap: each call drops at most expireBatch idle
// entries from the LRU tail, and an idle entry that is looked up is treated
// as absent. Len and the Sessions counters may therefore include idle
// entries not yet dropped; Sweep drops them all. A conversation is idle when
// more than the TTL has passed since its last request (exactly the TTL is
// still alive). The table assumes that now does not run backwards by much:
// the LRU order is the order of calls.
//
// Activity is exact and amortised O(1): the active conversations are a
// prefix of the LRU list (most recent first), up to a cursor. Each call
// that takes now first walks the cursor back towards the head past every
// entry last seen more than the active window ago, taking it out of its
// home's Active count; a request puts its session back at the head, active
// again. An entry becomes active once per request and is retired at most
// once per request, so the walk costs O(1) per request however it is
// spread (after a long quiet spell one call may retire many at once).
// A conversation is active while at most the window has passed since its
// last request. The window is at most the TTL.
//
// A Table is not safe for concurrent use.
type Table struct {
	ttl     int64 // nanoseconds, > 0
	window  int64 // active window, nanoseconds, 0 < window <= ttl
	max     int   // hard cap, > 0
	index   map[uint64]int32
	entries []entry
	head    int32 // most recently used
	tail    int32 // least recently used
	free    int32 // head of the free list, linked through entry.next
	act     int32 // the least recent active entry; nilIndex when none is active
	n       int
	base    time.Time // the first now seen; seen times are offsets from it
	hasBase bool
	counts  []ReplicaCounters // aligned with replica IDs, grown on demand
	// kv holds the entries' KV figures, aligned with entries, from the
	// first footprint recorded on (nil for a table that never sees one: the
	// seed's policies keep 32 bytes a conversation); an entry beyond its
	// length has none yet.
	kv []kvEntry
	// typical is a moving average of the footprints observed (every
	// response's prompt + answer): the size a conversation has on average
	// over its life, the expected footprint of a new one (admission);
	// 0 before the first.
	typical float64
	// releases is the min-heap (by at) of scheduled hold ends (Finish);
	// gaps is the estimator over every conversation's gaps, the return
	// timeout of a conversation without a gap of its own.
	releases []release
	gaps     gapStats
	gapped   bool // gaps holds at least one sample
	// hits holds the entries' observed hits (observed.go), aligned with
	// entries from the first observation on; nil for a table never told.
	hits []hitEntry
	// sharedHit is the moving average of the cached tokens of first
	// turns on a replica (observed.go): the shared prefix.
	sharedHit float64
	// learner learns the active window from the gaps between the
	// conversations' requests, unless the window is fixed (activity.go).
	learner activity
}

// NewTableWindow returns an empty table with an active window: a
// conversation counts as active while at most window has passed since its
// last request. A ttl or maxSessions of zero or less selects
// DefaultSessionTTL or DefaultMaxSessions. A window of zero or less is
// learned from the gaps between the conversations' requests
// (activity.go), from DefaultActiveWindow up; a window longer than the
// TTL is the TTL (a forgotten conversation is not active).
func NewTableWindow(ttl time.Duration, maxSessions int, window time.Duration) *Table {
	if ttl <= 0 {
		ttl = DefaultSessionTTL
	}
	learn := window <= 0
	if learn {
		window = DefaultActiveWindow
	}
	window = min(window, ttl)
	if maxSessions <= 0 {
		maxSessions = DefaultMaxSessions
	}
	if maxSessions > math.MaxInt32-1 {
		maxSessions = math.MaxInt32 - 1
	}
	return &Table{
		ttl:     int64(ttl),
		window:  int64(window),
		max:     maxSessions,
		index:   make(map[uint64]int32),
		head:    nilIndex,
		tail:    nilIndex,
		free:    nilIndex,
		act:     nilIndex,
		learner: activity{learn: learn, floor: int64(window)},
	}
}

// TTL is the idle time after which a conversation is forgotten.
func (t *Table) TTL() time.Duration { return time.Duration(t.ttl) }

// ActiveWindow is how recently a conversation must have sent a request to
// count as active: the fixed window, or the one learned so far
// (LearnsWindow).
func (t *Table) ActiveWindow() time.Duration { return time.Duration(t.window) }

// MaxSessions is the hard cap on remembered conversations.
func (t *Table) MaxSessions() int { return t.max }

// Len is the number of remembered conversations, including idle ones that
// lazy expiry has not dropped yet (see Sweep).
func (t *Table) Len() int { return t.n }

// Home returns the home of session, or false when the table does not know
// it or it has been idle for longer than the TTL. It does not count as a
// request: the session's last-seen time is unchanged. It also does a
// bounded amount of lazy expiry.
func (t *Table) Home(session string, now time.Time) (int, bool) {
	home, _, ok := t.Lookup(session, now)
	return home, ok
}

// Lookup is Home with the session's first home: the replica it was homed
// on when the table first saw it (its first turn's, for a policy's table),
// which re-homing does not change. That is the replica Stay compares a
// later turn with. first is -1 for a replica ID above 32767.
func (t *Table) Lookup(session string, now time.Time) (home, first int, ok bool) {
	at := t.clock(now)
	t.expire(at)
	i := t.find(fnv1a64(session), at)
	if i == nilIndex {
		return 0, 0, false
	}
	e := &t.entries[i]
	return int(e.home), int(e.first), true
}

// Assign makes home the home of session and marks the session seen at now,
// as if a request had been placed there, without counting a decision. It is
// for restoring a table (from a journal, say) and for tests. A negative
// home forgets the session.
func (t *Table) Assign(session string, home int, now time.Time) {
	if home < 0 {
		t.Remove(session)
		return
	}
	at := t.clock(now)
	t.expire(at)
	key := fnv1a64(session)
	if i := t.find(key, at); i != nilIndex {
		t.setHome(i, home)
		t.touch(i, at)
		return
	}
	t.insert(key, home, at)
}

// Remove forgets session and reports whether the table held it.
func (t *Table) Remove(session string) bool {
	i, ok := t.index[fnv1a64(session)]
	if ok {
		t.remove(i)
	}
	return ok
}

// Advance brings the table to now without a request: the Active counts
// retire every conversation that has left the active window, and a bounded
// amount of lazy expiry is done. Pick, Assign and Home do it themselves;
// call Advance before Counters or Fill when no call has passed now (a
// status page, a scrape with no traffic).
func (t *Table) Advance(now time.Time) {
	t.expire(t.clock(now))
}

// Sweep drops every conversation idle for longer than the TTL at now and
// returns how many it dropped. Its work is proportional to that number.
// It also retires the Active counts to now, as Advance does.
func (t *Table) Sweep(now time.Time) int {
	at := t.clock(now)
	t.retire(at)
	dropped := 0
	for t.tail != nilIndex && t.idle(t.tail, at) {
		t.remove(t.tail)
		dropped++
	}
	return dropped
}

// HomedOn is ReplicaCounters.Sessions of replica i (0 out of range),
// without copying the counters.
func (t *Table) HomedOn(i int) int {
	if i < 0 || i >= len(t.counts) {
		return 0
	}
	return t.counts[i].Sessions
}

// Counters returns a copy of the per-replica counters; index i holds
// replica i. Replicas the table never saw are absent or zero.
func (t *Table) Counters() []ReplicaCounters {
	return append([]ReplicaCounters(nil), t.counts...)
}

// Fill writes the number of active conversations homed on each replica
// (ReplicaCounters.Active) into s.Replicas[i].Sessions, as of the latest
// time the table was given (call Advance first to bring it to now).
func (t *Table) Fill(s *Snapshot) {
	for i := range s.Replicas {
		s.Replicas[i].Sessions = t.activeOn(i)
		s.Replicas[i].FootprintTokens = t.footprint(i)
	}
}

// footprint is ReplicaCounters.Footprint of replica r (0 out of range).
func (t *Table) footprint(r int) int {
	if r >= 0 && r < len(t.counts) {
		return t.counts[r].Footprint
	}
	return 0
}

// deactivate takes entry i out of its home's Active and Footprint counts.
func (t *Table) deactivate(i int32) {
	t.unhold(i)
	e := &t.entries[i]
	e.active = false
	c := &t.counts[e.home]
	c.Active--
	c.Footprint -= t.fp(i)
}

// activeOn is the number of active sessions homed on replica r
// (ReplicaCounters.Active): the "conversations held" of the affinity score,
// not the KV-held ones (Held, held.go).
func (t *Table) activeOn(r int) int {
	if r < len(t.counts) {
		return t.counts[r].Active
	}
	return 0
}

// counter returns replica r's counters, growing the slice if needed.
func (t *Table) counter(r int) *ReplicaCounters {
	for len(t.counts) <= r {
		t.counts = append(t.counts, ReplicaCounters{})
	}
	return &t.counts[r]
}

// clock turns now into nanoseconds since the first now the table saw.
// Offsets rather than UnixNano keep any time.Time valid, including the
// zero time a simulator may use as its epoch; Sub saturates.
func (t *Table) clock(now time.Time) int64 {
	if !t.hasBase {
		t.base, t.hasBase = now, true
	}
	return int64(now.Sub(t.base))
}

// idle reports whether entry i has been idle for longer than the TTL.
func (t *Table) idle(i int32, at int64) bool {
	return at-t.entries[i].seen > t.ttl
}

// expire retires the Active and Held counts to at and drops at most
// expireBatch idle entries from the LRU tail.
func (t *Table) expire(at int64) {
	t.retire(at)
	for k := 0; k < expireBatch && t.tail != nilIndex && t.idle(t.tail, at); k++ {
		t.remove(t.tail)
	}
}

// retire takes every entry last seen more than the window before at out of
// the Active counts, walking the cursor from the least recent active entry
// towards the head, and releases the held ones whose return timeout ended.
func (t *Table) retire(at int64) {
	for t.act != nilIndex {
		e := &t.entries[t.act]
		if at-e.seen > t.window {
			t.deactivate(t.act)
			t.act = e.prev
			continue
		}
		break
	}
	if len(t.releases) > 0 {
		t.releaseDue(at)
	}
}

// activate counts entry i, just moved to the head by a request, as
// active and held.
func (t *Table) activate(i int32) {
	e := &t.entries[i]
	if !e.active {
		e.active = true
		t.counts[e.home].Active++
		t.counts[e.home].Footprint += t.fp(i)
		if t.act == nilIndex {
			t.act = i
		}
	}
	t.hold(i)
}

// find returns the live entry for key, dropping it if it is idle.
func (t *Table) find(key uint64, at int64) int32 {
	i, ok := t.index[key]
	if !ok {
		return nilIndex
	}
	if t.idle(i, at) {
		t.remove(i)
		return nilIndex
	}
	return i
}

// peek returns the home of key's live entry without changing anything.
func (t *Table) peek(key uint64, at int64) (int, bool) {
	i, ok := t.index[key]
	if !ok || t.idle(i, at) {
		return 0, false
	}
	return int(t.entries[i].home), true
}

// insert adds a new entry at the head, evicting the LRU entry when full.
func (t *Table) insert(key uint64, home int, at int64) int32 {
	if t.n >= t.max {
		t.remove(t.tail)
	}
	var i int32
	if t.free != nilIndex {
		i = t.free
		t.free = t.entries[i].next
	} else {
		t.entries = append(t.entries, entry{})
		i = int32(len(t.entries) - 1)
	}
	first := int16(-1)
	if home <= math.MaxInt16 {
		first = int16(home)
	}
	t.entries[i] = entry{key: key, seen: at, prev: nilIndex, next: nilIndex, home: int32(home), first: first}
	if int(i) < len(t.kv) {
		t.kv[i] = kvEntry{left: -1}
	}
	if int(i) < len(t.hits) {
		t.hits[i] = hitEntry{hadOn: -1}
	}
	t.counter(home).Sessions++
	t.pushFront(i)
	t.activate(i)
	t.index[key] = i
	t.n++
	return i
}

// remove unlinks entry i, forgets its key and puts it on the free list.
func (t *Table) remove(i int32) {
	e := &t.entries[i]
	if e.active {
		if t.act == i {
			t.act = e.prev
		}
		t.deactivate(i)
	}
	t.unlink(i)
	delete(t.index, e.key)
	t.counts[e.home].Sessions--
	e.next = t.free
	t.free = i
	t.n--
}

// touch marks entry i seen at at, moves it to the head and counts it
// active and held (a request: any scheduled release is void).
func (t *Table) touch(i int32, at int64) {
	e := &t.entries[i]
	e.seen = at
	if int(i) < len(t.kv) {
		t.kv[i].until = 0
	}
	if t.head != i {
		if t.act == i { // the least recent active entry leaves its place
			t.act = e.prev
		}
		t.unlink(i)
		t.pushFront(i)
	}
	t.activate(i)
}

// setHome moves entry i to a new home, keeping the Sessions counts right.
func (t *Table) setHome(i int32, home int) {
	e := &t.entries[i]
	if int(e.home) == home {
		return
	}
	t.counts[e.home].Sessions--
	c := t.counter(home)
	c.Sessions++
	if e.active {
		t.counts[e.home].Active--
		t.counts[e.home].Footprint -= t.fp(i)
		c.Active++
		c.Footprint += t.fp(i)
	}
	if e.held {
		t.counts[e.home].Held--
		t.counts[e.home].HeldFootprint -= t.fp(i)
		c.Held++
		c.HeldFootprint += t.fp(i)
	}
	e.home = int32(home)
}

func (t *Table) unlink(i int32) {
	e := &t.entries[i]
	if e.prev != nilIndex {
		t.entries[e.prev].next = e.next
	} else {
		t.head = e.next
	}
	if e.next != nilIndex {
		t.entries[e.next].prev = e.prev
	} else {
		t.tail = e.prev
	}
	e.prev, e.next = nilIndex, nilIndex
}

func (t *Table) pushFront(i int32) {
	e := &t.entries[i]
	e.prev = nilIndex
	e.next = t.head
	if t.head != nilIndex {
		t.entries[t.head].prev = i
	}
	t.head = i
	if t.tail == nilIndex {
		t.tail = i
	}
}

// Reconfigure changes the table's TTL, cap and active window in place, as
// NewTableWindow reads them (zero or less: the defaults), keeping every
// conversation and its home: a proxy's configuration reload must not
// forget where conversations are cached. At now, the conversations idle
// for longer than the new TTL are dropped, the least recent ones beyond the
// new cap are evicted, and the Active counts are those of the new window.
// Its work is proportional to the number of active conversations plus the
// number dropped, which it returns.
func (t *Table) Reconfigure(ttl time.Duration, maxSessions int, window time.Duration, now time.Time) (dropped int) {
	n := NewTableWindow(ttl, maxSessions, window)
	t.ttl, t.window, t.max = n.ttl, n.window, n.max
	t.learner.learn, t.learner.floor = n.learner.learn, n.learner.floor
	if w, ok := t.learner.window(t.ttl); ok && t.learner.learn {
		t.window = w // what the gaps seen so far say, within the new bounds
	}
	at := t.clock(now)
	// Take every active entry out of the Active counts, then count the
	// prefix of the LRU list within the new window.
	for i := t.head; i != nilIndex && t.entries[i].active; i = t.entries[i].next {
		t.unhold(i)
		t.entries[i].active = false
		t.counts[t.entries[i].home].Active--
		t.counts[t.entries[i].home].Footprint -= t.fp(i)
	}
	t.act = nilIndex
	for t.tail != nilIndex && (t.n > t.max || t.idle(t.tail, at)) {
		t.remove(t.tail)
		dropped++
	}
	for i := t.head; i != nilIndex && at-t.entries[i].seen <= t.window; i = t.entries[i].next {
		t.entries[i].active = true
		t.counts[t.entries[i].home].Active++
		t.counts[t.entries[i].home].Footprint += t.fp(i)
		if t.holding(i, at) {
			t.hold(i)
		}
		t.act = i
	}
	return dropped
}

// Renumber follows a change of the replica list: the conversations homed
// on replica i move to replica to[i], with its counters; those homed on a
// replica with to[i] < 0 or i >= len(to) (one that was removed) are
// forgotten, so that their next request is placed as a new conversation;
// it returns how many. to must not send two replicas to one. Its work is
// proportional to the number of conversations.
func (t *Table) Renumber(to []int) (forgotten int) {
	dest := func(i int32) int {
		if int(i) < len(to) {
			return to[i]
		}
		return -1
	}
	for i := t.head; i != nilIndex; {
		next := t.entries[i].next
		if dest(t.entries[i].home) < 0 {
			t.remove(i)
			forgotten++
		}
		i = next
	}
	counts := make([]ReplicaCounters, 0, len(t.counts))
	for i, c := range t.counts {
		if d := dest(int32(i)); d >= 0 {
			for len(counts) <= d {
				counts = append(counts, ReplicaCounters{})
			}
			counts[d] = c
		}
	}
	t.counts = counts
	for i := t.head; i != nilIndex; i = t.entries[i].next {
		t.entries[i].home = int32(dest(t.entries[i].home))
	}
	for i := range t.kv {
		if k := &t.kv[i]; k.left >= 0 {
			k.left = int16(dest(int32(k.left)))
		}
	}
	for i := range t.hits {
		if h := &t.hits[i]; h.hadOn >= 0 {
			h.hadOn = int32(dest(h.hadOn))
		}
	}
	return forgotten
}
