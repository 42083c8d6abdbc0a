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
