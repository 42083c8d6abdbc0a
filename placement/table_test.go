package placement

import (
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// modelTable is an obviously correct session table: eager expiry, LRU
// order as a slice of session ids (oldest first).
type modelTable struct {
	ttl  time.Duration
	win  time.Duration // active window
	max  int
	home map[string]int
	seen map[string]time.Time
	lru  []string
}

func newModel(ttl, win time.Duration, max int) *modelTable {
	return &modelTable{ttl: ttl, win: min(win, ttl), max: max, home: map[string]int{}, seen: map[string]time.Time{}}
}

func (m *modelTable) expire(now time.Time) {
	for len(m.lru) > 0 && now.Sub(m.seen[m.lru[0]]) > m.ttl {
		m.drop(m.lru[0])
	}
}

func (m *modelTable) drop(s string) {
	delete(m.home, s)
	delete(m.seen, s)
	m.lru = slices.DeleteFunc(m.lru, func(x string) bool { return x == s })
}

func (m *modelTable) assign(s string, home int, now time.Time) {
	m.expire(now)
	if _, ok := m.home[s]; !ok && len(m.home) >= m.max {
		m.drop(m.lru[0])
	}
	m.drop(s)
	m.home[s], m.seen[s] = home, now
	m.lru = append(m.lru, s)
}

// active returns the number of sessions homed on each replica that were
// seen within the window at now.
func (m *modelTable) active(now time.Time, replicas int) []int {
	n := make([]int, replicas)
	for s, h := range m.home {
		if now.Sub(m.seen[s]) <= m.win {
			n[h]++
		}
	}
	return n
}

// reconfigure is Table.Reconfigure on the model.
func (m *modelTable) reconfigure(ttl, win time.Duration, max int, now time.Time) {
	m.ttl, m.win, m.max = ttl, min(win, ttl), max
	m.expire(now)
	for len(m.home) > m.max {
		m.drop(m.lru[0])
	}
}

// renumber is Table.Renumber on the model.
func (m *modelTable) renumber(to []int) {
	for s, h := range m.home {
		if h >= len(to) || to[h] < 0 {
			m.drop(s)
		} else {
			m.home[s] = to[h]
		}
	}
}

func (m *modelTable) lookup(s string, now time.Time) (int, bool) {
	m.expire(now)
	h, ok := m.home[s]
	return h, ok
}

// TestTableMatchesModel drives a Table and the model through the same
// random operations with time moving forward, with active windows shorter
// than, equal to and (capped) longer than the TTL. The Active counts are
// exact after every call; Sessions only after Sweep.
func TestTableMatchesModel(t *testing.T) {
	for _, win := range []time.Duration{time.Millisecond, 3 * time.Second, 10 * time.Second, time.Hour} {
		t.Run(win.String(), func(t *testing.T) { testTableMatchesModel(t, win, false) })
	}
}

// TestTableReconfigureMatchesModel is TestTableMatchesModel with a
// configuration reload every few hundred steps: Reconfigure to a random
// TTL, window and cap, and Renumber to a random permutation of the
// replicas with one of them removed now and then.
func TestTableReconfigureMatchesModel(t *testing.T) {
	for _, win := range []time.Duration{time.Millisecond, 3 * time.Second, time.Hour} {
		t.Run(win.String(), func(t *testing.T) { testTableMatchesModel(t, win, true) })
	}
}

func testTableMatchesModel(t *testing.T, win time.Duration, reload bool) {
	const ttl, capacity, ids, replicas = 10 * time.Second, 50, 120, 4
	max := capacity
	rng := rand.New(rand.NewPCG(7, 11))
	tab := NewTableWindow(ttl, max, win)
	m := newModel(ttl, win, max)
	now := time.Time{} // the zero time must work as an epoch
	for step := range 20000 {
		now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
		s := "s" + strconv.Itoa(rng.IntN(ids))
		op := rng.IntN(10)
		switch {
		case reload && step%300 == 150:
			ttl := time.Duration(1+rng.IntN(15)) * time.Second
			win := time.Duration(1+rng.IntN(12000)) * time.Millisecond
			max = 10 + rng.IntN(capacity)
			before := tab.Len()
			dropped := tab.Reconfigure(ttl, max, win, now)
			m.reconfigure(ttl, win, max, now)
			if tab.Len() != len(m.home) || tab.Len() != before-dropped {
				t.Fatalf("step %d: Reconfigure dropped %d of %d, leaving %d; model %d", step, dropped, before, tab.Len(), len(m.home))
			}
			op = 9 // the counts are checked as of now
		case reload && step%300 == 0:
			to := rng.Perm(replicas)
			if rng.IntN(2) == 0 {
				to[rng.IntN(replicas)] = -1
			}
			before := tab.Len()
			got := tab.Renumber(to)
			m.renumber(to)
			if tab.Len() != before-got {
				t.Fatalf("step %d: Renumber forgot %d, but Len went from %d to %d", step, got, before, tab.Len())
			}
			op = 9
		case op < 5:
			h := rng.IntN(replicas)
			tab.Assign(s, h, now)
			m.assign(s, h, now)
		case op < 9:
			h1, ok1 := tab.Home(s, now)
			h2, ok2 := m.lookup(s, now)
			if h1 != h2 || ok1 != ok2 {
				t.Fatalf("step %d: Home(%s) = %d, %v; model %d, %v", step, s, h1, ok1, h2, ok2)
			}
		default:
			_, live := m.lookup(s, now)
			if got := tab.Remove(s); live && !got {
				t.Fatalf("step %d: Remove(%s) = false for a live session", step, s)
			}
			m.drop(s)
		}
		if tab.Len() > max {
			t.Fatalf("step %d: Len %d over the cap %d", step, tab.Len(), max)
		}
		want := m.active(now, replicas)
		if op == 9 { // Remove takes no now: the counts are as of the last call
			tab.Advance(now)
		}
		c := tab.Counters()
		for r := range replicas {
			got := 0
			if r < len(c) {
				got = c[r].Active
				if got > c[r].Sessions {
					t.Fatalf("step %d: replica %d Active %d > Sessions %d", step, r, got, c[r].Sessions)
				}
			}
			if got != want[r] {
				t.Fatalf("step %d: replica %d Active %d, model %d", step, r, got, want[r])
			}
		}
		if step%97 == 0 {
			tab.Sweep(now)
			m.expire(now)
			if tab.Len() != len(m.home) {
				t.Fatalf("step %d: Len after Sweep %d, model %d", step, tab.Len(), len(m.home))
			}
			held := make([]int, replicas)
			for _, h := range m.home {
				held[h]++
			}
			s := &Snapshot{Replicas: make([]Replica, replicas)}
			tab.Fill(s)
			c := tab.Counters()
			for r := range replicas {
				sessions := 0
				if r < len(c) {
					sessions = c[r].Sessions
				}
				if sessions != held[r] {
					t.Fatalf("step %d: replica %d holds %d sessions, model %d", step, r, sessions, held[r])
				}
				if s.Replicas[r].Sessions != want[r] {
					t.Fatalf("step %d: Fill gave replica %d %d sessions, want the %d active", step, r, s.Replicas[r].Sessions, want[r])
				}
			}
		}
	}
	if !reload && len(tab.entries) > max {
		t.Errorf("entries slice grew to %d, want at most the cap %d (free list reuse)", len(tab.entries), max)
	}
}

func TestTableBasics(t *testing.T) {
	tab := NewTable(0, 0)
	if tab.TTL() != DefaultSessionTTL || tab.MaxSessions() != DefaultMaxSessions {
		t.Fatalf("defaults: TTL %v cap %d", tab.TTL(), tab.MaxSessions())
	}
	tab.Assign("a", 2, t0)
	tab.Assign("b", 2, t0)
	tab.Assign("a", 0, t0.Add(time.Second)) // moves home
	c := tab.Counters()
	if len(c) != 3 || c[0].Sessions != 1 || c[2].Sessions != 1 {
		t.Fatalf("counters %+v", c)
	}
	c[0].Sessions = 99
	if tab.Counters()[0].Sessions != 1 {
		t.Error("Counters returned the table's own slice, want a copy")
	}
	s := farm(5, 32)
	tab.Fill(s)
	if got := []int{s.Replicas[0].Sessions, s.Replicas[2].Sessions, s.Replicas[4].Sessions}; !equalInts(got, []int{1, 1, 0}) {
		t.Errorf("Fill: %v", got)
	}
	tab.Assign("b", -1, t0)
	if _, ok := tab.Home("b", t0); ok || tab.Len() != 1 {
		t.Errorf("Assign(b, -1) did not forget b: len %d", tab.Len())
	}
	if tab.Remove("nope") {
		t.Error("Remove of an unknown session reported true")
	}
	if n := tab.Sweep(t0.Add(DefaultSessionTTL + 2*time.Second)); n != 1 || tab.Len() != 0 {
		t.Errorf("Sweep dropped %d, len %d; want 1 and 0", n, tab.Len())
	}
}

// TestTableLazyExpiryIsBounded: one call drops at most expireBatch idle
// entries, and repeated calls catch up.
func TestTableLazyExpiryIsBounded(t *testing.T) {
	tab := NewTable(time.Second, 1000)
	for i := range 100 {
		tab.Assign("s"+strconv.Itoa(i), 0, t0)
	}
	later := t0.Add(time.Minute)
	tab.Home("x", later)
	if tab.Len() != 100-expireBatch {
		t.Fatalf("after one call Len = %d, want %d", tab.Len(), 100-expireBatch)
	}
	for range 100 {
		tab.Home("x", later)
	}
	if tab.Len() != 0 {
		t.Fatalf("after many calls Len = %d, want 0", tab.Len())
	}
}

// TestTableActiveWindow: a session counts as active while it was seen
// within the window, stops counting after it, counts again when seen, keeps
// routing home for the whole TTL, and leaves both counts consistently when
// it expires, is evicted or is removed.
func TestTableActiveWindow(t *testing.T) {
	const ttl, win = 10 * time.Minute, 2 * time.Minute
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	type step struct {
		at     time.Duration
		op     string // assign (session -> home), home (lookup), remove, advance, sweep
		s      string
		home   int // assign: the home; home: the expected one, -1 for none
		active []int
		held   []int // Sessions, before lazy expiry has caught up
	}
	tests := []struct {
		name  string
		max   int
		steps []step
	}{
		{"goes inactive after the window", 10, []step{
			{0, "assign", "a", 0, []int{1, 0}, []int{1, 0}},
			{0, "assign", "b", 1, []int{1, 1}, []int{1, 1}},
			{win, "advance", "", 0, []int{1, 1}, []int{1, 1}}, // exactly the window is active
			{win + 1, "advance", "", 0, []int{0, 0}, []int{1, 1}},
		}},
		{"re-activates when seen", 10, []step{
			{0, "assign", "a", 0, []int{1}, []int{1}},
			{3 * time.Minute, "home", "a", 0, []int{0}, []int{1}}, // a lookup is not a request
			{4 * time.Minute, "assign", "a", 0, []int{1}, []int{1}},
			{6 * time.Minute, "advance", "", 0, []int{1}, []int{1}},
			{6*time.Minute + 1, "advance", "", 0, []int{0}, []int{1}},
		}},
		{"routes home within the TTL", 10, []step{
			{0, "assign", "a", 1, []int{0, 1}, []int{0, 1}},
			{ttl, "home", "a", 1, []int{0, 0}, []int{0, 1}},
			{ttl + 1, "home", "a", -1, []int{0, 0}, []int{0, 0}},
		}},
		{"moving home moves the active count", 10, []step{
			{0, "assign", "a", 0, []int{1, 0}, []int{1, 0}},
			{0, "assign", "b", 0, []int{2, 0}, []int{2, 0}},
			{time.Minute, "assign", "a", 1, []int{1, 1}, []int{1, 1}},
			{3 * time.Minute, "advance", "", 0, []int{0, 1}, []int{1, 1}},   // a: exactly the window; b quiet
			{3*time.Minute + 1, "assign", "b", 1, []int{0, 1}, []int{0, 2}}, // a quiet, b active on 1
		}},
		{"TTL expiry of an inactive session", 10, []step{
			{0, "assign", "a", 0, []int{1}, []int{1}},
			{5 * time.Minute, "assign", "b", 0, []int{1}, []int{2}},
			{ttl + 1, "advance", "", 0, []int{0}, []int{1}},
			{ttl + 5*time.Minute + 1, "sweep", "", 0, []int{0}, []int{0}},
		}},
		{"LRU eviction of an active session", 2, []step{
			{0, "assign", "a", 0, []int{1, 0}, []int{1, 0}},
			{time.Second, "assign", "b", 1, []int{1, 1}, []int{1, 1}},
			{2 * time.Second, "assign", "c", 1, []int{0, 2}, []int{0, 2}}, // evicts a, the least recent and the cursor
			{3 * time.Second, "home", "a", -1, []int{0, 2}, []int{0, 2}},
			{3 * time.Minute, "advance", "", 0, []int{0, 0}, []int{0, 2}},
		}},
		{"LRU eviction of an inactive session", 2, []step{
			{0, "assign", "a", 0, []int{1, 0}, []int{1, 0}},
			{3 * time.Minute, "assign", "b", 1, []int{0, 1}, []int{1, 1}},
			{3 * time.Minute, "assign", "c", 1, []int{0, 2}, []int{0, 2}},
		}},
		{"remove the cursor and the head", 10, []step{
			{0, "assign", "a", 0, []int{1}, []int{1}},
			{time.Second, "assign", "b", 0, []int{2}, []int{2}},
			{time.Second, "remove", "a", 0, []int{1}, []int{1}},
			{time.Second, "remove", "b", 0, []int{0}, []int{0}},
			{2 * time.Second, "assign", "c", 0, []int{1}, []int{1}},
			{2*time.Second + win + 1, "advance", "", 0, []int{0}, []int{1}},
		}},
		{"a request to the cursor moves it", 10, []step{
			{0, "assign", "a", 0, []int{1, 0}, []int{1, 0}},
			{time.Minute, "assign", "b", 1, []int{1, 1}, []int{1, 1}},
			{90 * time.Second, "assign", "a", 0, []int{1, 1}, []int{1, 1}}, // a was the least recent active
			{win + time.Minute + 1, "advance", "", 0, []int{1, 0}, []int{1, 1}},
			{win + 90*time.Second + 1, "advance", "", 0, []int{0, 0}, []int{1, 1}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tab := NewTableWindow(ttl, tt.max, win)
			for k, st := range tt.steps {
				now := at(st.at)
				switch st.op {
				case "assign":
					tab.Assign(st.s, st.home, now)
				case "home":
					h, ok := tab.Home(st.s, now)
					if !ok {
						h = -1
					}
					if h != st.home {
						t.Fatalf("step %d: Home(%s) = %d, want %d", k, st.s, h, st.home)
					}
				case "remove":
					if !tab.Remove(st.s) {
						t.Fatalf("step %d: Remove(%s) = false", k, st.s)
					}
				case "advance":
					tab.Advance(now)
				case "sweep":
					tab.Sweep(now)
				}
				c := tab.Counters()
				s := farm(len(st.active), 32)
				tab.Fill(s)
				for r := range st.active {
					var rc ReplicaCounters
					if r < len(c) {
						rc = c[r]
					}
					if rc.Active != st.active[r] || rc.Sessions != st.held[r] || s.Replicas[r].Sessions != st.active[r] {
						t.Fatalf("step %d (%s %s at %v): replica %d active %d sessions %d filled %d; want active %d sessions %d",
							k, st.op, st.s, st.at, r, rc.Active, rc.Sessions, s.Replicas[r].Sessions, st.active[r], st.held[r])
					}
				}
			}
		})
	}
}

func TestTableActiveWindowDefaults(t *testing.T) {
	if w := NewTable(0, 0).ActiveWindow(); w != DefaultActiveWindow {
		t.Errorf("NewTable window %v, want %v", w, DefaultActiveWindow)
	}
	if w := NewTableWindow(time.Minute, 0, 0).ActiveWindow(); w != time.Minute {
		t.Errorf("window under a 1m TTL %v, want it capped at the TTL", w)
	}
	if w := NewTableWindow(0, 0, 30*time.Second).ActiveWindow(); w != 30*time.Second {
		t.Errorf("window %v, want 30s", w)
	}
	if w := NewAffinity(Config{ActiveWindow: 5 * time.Minute}).Table().ActiveWindow(); w != 5*time.Minute {
		t.Errorf("affinity table window %v, want 5m", w)
	}
	err := Config{ActiveWindow: -time.Second}.Validate()
	if err == nil || !strings.Contains(err.Error(), "ActiveWindow -1s is negative") {
		t.Errorf("Validate = %v, want an error naming ActiveWindow", err)
	}
	if _, err := New(StrategyAffinity, Config{ActiveWindow: -1}); err == nil {
		t.Error("New accepted a negative ActiveWindow")
	}
}

// TestTableActiveRetireIsAmortised: retiring a large backlog at once is one
// walk, and the counts stay exact.
func TestTableActiveRetireIsAmortised(t *testing.T) {
	tab := NewTableWindow(time.Hour, 0, time.Minute)
	for i := range 10000 {
		tab.Assign("s"+strconv.Itoa(i), i%4, t0.Add(time.Duration(i)*time.Millisecond))
	}
	tab.Advance(t0.Add(time.Minute + 5*time.Second)) // retires the first 5000
	total := 0
	for _, c := range tab.Counters() {
		total += c.Active
	}
	if total != 5000 {
		t.Fatalf("active after the window passed half the sessions: %d, want 5000", total)
	}
	if tab.Len() != 10000 {
		t.Fatalf("Len %d, want 10000 (homes are kept)", tab.Len())
	}
}

func TestHomedOn(t *testing.T) {
	tab := NewTable(time.Minute, 0)
	t0 := time.Unix(0, 0)
	tab.Assign("a", 2, t0)
	tab.Assign("b", 2, t0)
	tab.Assign("c", 0, t0)
	for i, want := range []int{1, 0, 2, 0} {
		if got := tab.HomedOn(i); got != want {
			t.Errorf("HomedOn(%d) = %d, want %d", i, got, want)
		}
	}
	if tab.HomedOn(-1) != 0 || tab.HomedOn(99) != 0 {
		t.Error("HomedOn out of range: want 0")
	}
}

// Lookup keeps a session's first home when it is re-homed, in the
// entry's padding (32 bytes).
func TestTableLookupFirst(t *testing.T) {
	if got := unsafe.Sizeof(entry{}); got != 32 {
		t.Errorf("entry is %d bytes, want 32", got)
	}
	tab := NewTable(time.Hour, 10)
	now := time.Unix(1000, 0)
	tab.Assign("s", 2, now)
	tab.Assign("s", 5, now.Add(time.Second)) // re-homed
	home, first, ok := tab.Lookup("s", now.Add(2*time.Second))
	if !ok || home != 5 || first != 2 {
		t.Errorf("Lookup = %d, %d, %v; want home 5, first 2", home, first, ok)
	}
	tab.Assign("big", 40000, now)
	if _, first, _ := tab.Lookup("big", now); first != -1 {
		t.Errorf("first of replica 40000 = %d, want -1", first)
	}
	if _, _, ok := tab.Lookup("nobody", now); ok {
		t.Error("Lookup of an unknown session reports it known")
	}
}

func TestStay(t *testing.T) {
	tests := []struct {
		later         bool
		first, served int
		counted, stay bool
	}{
		{false, 0, 0, false, false}, // a first turn is not counted
		{true, 0, 0, true, true},
		{true, 0, 1, true, false}, // spilled, or re-homed
		{true, -1, 0, true, false},
	}
	var c StayCount
	for _, tt := range tests {
		counted, stay := Stay(tt.later, tt.first, tt.served)
		if counted != tt.counted || stay != tt.stay {
			t.Errorf("Stay(%v, %d, %d) = %v, %v; want %v, %v", tt.later, tt.first, tt.served, counted, stay, tt.counted, tt.stay)
		}
		c.Add(tt.later, tt.first, tt.served)
	}
	if c.Later != 3 || c.Home != 1 || math.Abs(c.Pct()-100.0/3) > 1e-9 {
		t.Errorf("StayCount %+v, Pct %v; want 3 later, 1 home, 33.3%%", c, c.Pct())
	}
	if !math.IsNaN((StayCount{}).Pct()) {
		t.Error("Pct before any later turn must be NaN")
	}
}

// heldModel is an obviously correct account of held conversations (see
// "Held conversations" in held.go): every session's request state kept
// eagerly, Held and HeldFootprint recomputed from scratch.
type heldModel struct {
	*modelTable
	st     map[string]*heldState
	pooled gapStats
	gapped bool
}

type heldState struct {
	inFlight       int
	ended, gapped  bool
	endAt, until   time.Time
	fp             int
	gaps           gapStats
	scheduledUntil bool
}

func (m *heldModel) state(s string) *heldState {
	if m.st[s] == nil {
		m.st[s] = &heldState{}
	}
	return m.st[s]
}

// sync forgets the state of sessions the model table dropped.
func (m *heldModel) sync() {
	for s := range m.st {
		if _, ok := m.home[s]; !ok {
			delete(m.st, s)
		}
	}
}

func (m *heldModel) assign(s string, home int, now time.Time) {
	m.expire(now)
	m.sync() // a session that expired comes back new
	m.modelTable.assign(s, home, now)
	m.sync()
	m.state(s).scheduledUntil = false // a request: any release is void
}

func (m *heldModel) start(s string, now time.Time) {
	m.expire(now)
	m.sync()
	if _, ok := m.home[s]; !ok {
		return
	}
	k := m.state(s)
	if k.inFlight == 0 && k.ended {
		r := now.Sub(k.endAt).Seconds()
		k.gaps.add(r, !k.gapped)
		m.pooled.add(r, !m.gapped)
		k.gapped, m.gapped = true, true
	}
	k.inFlight++
	k.scheduledUntil = false
}

func (m *heldModel) finish(s string, tokens int, now time.Time) {
	m.expire(now)
	m.sync()
	if _, ok := m.home[s]; !ok {
		return
	}
	k := m.state(s)
	if tokens > 0 {
		k.fp = tokens
	}
	if k.inFlight > 0 {
		k.inFlight--
	}
	if k.inFlight > 0 {
		return
	}
	k.ended, k.endAt = true, now
	hold := m.win
	switch {
	case k.gapped:
		hold = time.Duration(max(k.gaps.timeout(), float64(MinHold)))
	case m.gapped:
		hold = time.Duration(max(m.pooled.timeout(), float64(MinHold)))
	}
	k.until, k.scheduledUntil = now.Add(min(hold, m.win)), true
}

// held returns Held and HeldFootprint per replica at now.
func (m *heldModel) held(now time.Time, replicas int) (n, fp []int) {
	n, fp = make([]int, replicas), make([]int, replicas)
	for s, h := range m.home {
		if now.Sub(m.seen[s]) > m.win {
			continue
		}
		k := m.state(s)
		if !k.ended || k.inFlight > 0 || !k.scheduledUntil || !now.After(k.until) {
			n[h]++
			fp[h] += k.fp
		}
	}
	return n, fp
}

// TestTableHeldMatchesModel drives a Table and heldModel through random
// requests (Assign as the pick's touch), Start, Finish with and without a
// footprint, Remove, and now and then a reload (Reconfigure, Renumber):
// Held and HeldFootprint are exact after every call, Held <= Active, and
// with no Finish at all Held == Active.
func TestTableHeldMatchesModel(t *testing.T) {
	for _, win := range []time.Duration{500 * time.Millisecond, 3 * time.Second, 8 * time.Second} {
		t.Run(win.String(), func(t *testing.T) {
			// Few sessions, so that their gaps are shorter than the window.
			const ttl, capacity, ids, replicas = 10 * time.Second, 12, 16, 4
			max := capacity
			rng := rand.New(rand.NewPCG(3, 5))
			tab := NewTableWindow(ttl, max, win)
			m := &heldModel{modelTable: newModel(ttl, win, max), st: map[string]*heldState{}}
			now := time.Time{}
			released := 0 // checks where some active conversation was not held
			for step := range 30000 {
				now = now.Add(time.Duration(rng.IntN(200)) * time.Millisecond)
				s := "s" + strconv.Itoa(rng.IntN(ids))
				switch op := rng.IntN(20); {
				case step%500 == 250:
					ttl := time.Duration(2+rng.IntN(10)) * time.Second
					win := time.Duration(100+rng.IntN(9000)) * time.Millisecond
					max = 8 + rng.IntN(capacity)
					tab.Reconfigure(ttl, max, win, now)
					m.reconfigure(ttl, win, max, now)
					m.sync()
				case step%500 == 0:
					to := rng.Perm(replicas)
					if rng.IntN(2) == 0 {
						to[rng.IntN(replicas)] = -1
					}
					tab.Renumber(to)
					m.renumber(to)
					m.sync()
				case op < 6:
					h := rng.IntN(replicas)
					tab.Assign(s, h, now)
					m.assign(s, h, now)
				case op < 11:
					tab.Start(s, now)
					m.start(s, now)
				case op < 18:
					tokens := 0
					if rng.IntN(3) > 0 {
						tokens = 1 + rng.IntN(5000)
					}
					tab.Finish(s, tokens, now)
					m.finish(s, tokens, now)
				case op < 19:
					tab.Remove(s)
					m.drop(s)
					m.sync()
				}
				tab.Advance(now)
				m.expire(now)
				m.sync()
				wantN, wantFP := m.held(now, replicas)
				c := tab.Counters()
				for r := range replicas {
					var got ReplicaCounters
					if r < len(c) {
						got = c[r]
					}
					if got.Held != wantN[r] || got.HeldFootprint != wantFP[r] || got.Held > got.Active {
						t.Fatalf("step %d: replica %d Held %d HeldFootprint %d (Active %d), model %d and %d", step, r, got.Held, got.HeldFootprint, got.Active, wantN[r], wantFP[r])
					}
					if got.Held < got.Active {
						released++
					}
				}
			}
			if released < 500 {
				t.Errorf("only %d checks saw a released conversation: the test does not exercise releases", released)
			}
			if n := len(tab.releases); n > 30000 {
				t.Errorf("release heap holds %d items, want it drained as releases fall due", n)
			}
		})
	}
}

// TestTableHeldWithoutFinish: a caller that reports no ends (the
// simulator) holds every active conversation: Held and HeldFootprint
// equal Active and Footprint.
func TestTableHeldWithoutFinish(t *testing.T) {
	tab := NewTableWindow(time.Minute, 100, 10*time.Second)
	now := time.Time{}
	for i := range 50 {
		now = now.Add(time.Second)
		s := "s" + strconv.Itoa(i%17)
		tab.Assign(s, i%3, now)
		tab.Observe(s, 100+i)
		for r, c := range tab.Counters() {
			if c.Held != c.Active || c.HeldFootprint != c.Footprint {
				t.Fatalf("step %d: replica %d Held %d/%d HeldFootprint %d/%d, want them equal", i, r, c.Held, c.Active, c.HeldFootprint, c.Footprint)
			}
		}
	}
}

// TestReturnTimeout: the return timeout follows RFC 6298's arithmetic
// over a conversation's own gaps, with MinHold below and the active window
// above; a conversation without a gap of its own takes the estimate over
// every gap; before any gap, the window.
func TestReturnTimeout(t *testing.T) {
	const win = 2 * time.Minute
	tab := NewTableWindow(time.Hour, 100, win)
	at := func(s float64) time.Time { return time.Time{}.Add(time.Duration(s * float64(time.Second))) }
	turn := func(s string, start, end float64) {
		t.Helper()
		tab.Assign(s, 0, at(start))
		if !tab.Start(s, at(start)) || !tab.Finish(s, 100, at(end)) {
			t.Fatalf("%s: Start/Finish on a known session failed", s)
		}
	}
	timeout := func(s string) time.Duration {
		d, ok := tab.ReturnTimeout(s)
		if !ok {
			t.Fatalf("ReturnTimeout(%s): unknown", s)
		}
		return d
	}
	turn("a", 0, 1)
	if got := timeout("a"); got != win {
		t.Errorf("before any gap: %v, want the window %v", got, win)
	}
	turn("a", 3, 4) // gap 2s: SRTT 2, RTTVAR 1
	if got := timeout("a"); got != 6*time.Second {
		t.Errorf("after a gap of 2s: %v, want 2 + 4x1 = 6s", got)
	}
	turn("a", 6, 7) // gap 2s: RTTVAR 0.75, SRTT 2
	if got := timeout("a"); got != 5*time.Second {
		t.Errorf("after two gaps of 2s: %v, want 2 + 4x0.75 = 5s", got)
	}
	turn("b", 10, 11) // no gap of its own: the pooled 2s, 2s -> RTTVAR 0.75
	if got := timeout("b"); got != 5*time.Second {
		t.Errorf("b, no gap of its own: %v, want the pooled 5s", got)
	}
	turn("c", 20, 21)
	turn("c", 21.01, 21.5) // a gap of 10ms: 0.01 + 0.02 s, rounded up
	if got := timeout("c"); got != MinHold {
		t.Errorf("c, 10ms gap: %v, want MinHold %v", got, MinHold)
	}
	turn("d", 30, 31)
	turn("d", 131, 132) // a gap of 100s: 100 + 200 s, capped
	if got := timeout("d"); got != win {
		t.Errorf("d, 100s gap: %v, want the window %v", got, win)
	}
	if _, ok := tab.ReturnTimeout("nobody"); ok {
		t.Errorf("ReturnTimeout of an unknown session: ok")
	}
}

// NewTable returns an empty table with the DefaultActiveWindow (capped at
// the TTL). A ttl or maxSessions of zero or less selects DefaultSessionTTL
// or DefaultMaxSessions.
func NewTable(ttl time.Duration, maxSessions int) *Table {
	return NewTableWindow(ttl, maxSessions, 0)
}
