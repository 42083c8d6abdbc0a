package placement

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"
)

// modelTable is an obviously correct session table: eager expiry, LRU
// order as a slice of session ids (oldest first).
type modelTable struct {
	ttl  time.Duration
	max  int
	home map[string]int
	seen map[string]time.Time
	lru  []string
}

func newModel(ttl time.Duration, max int) *modelTable {
	return &modelTable{ttl: ttl, max: max, home: map[string]int{}, seen: map[string]time.Time{}}
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

func (m *modelTable) lookup(s string, now time.Time) (int, bool) {
	m.expire(now)
	h, ok := m.home[s]
	return h, ok
}

// TestTableMatchesModel drives a Table and the model through the same
// random operations with time moving forward.
func TestTableMatchesModel(t *testing.T) {
	const ttl, max, ids, replicas = 10 * time.Second, 50, 120, 4
	rng := rand.New(rand.NewPCG(7, 11))
	tab := NewTable(ttl, max)
	m := newModel(ttl, max)
	now := time.Time{} // the zero time must work as an epoch
	for step := range 20000 {
		now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
		s := "s" + strconv.Itoa(rng.IntN(ids))
		switch op := rng.IntN(10); {
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
			for r := range replicas {
				if s.Replicas[r].Sessions != held[r] {
					t.Fatalf("step %d: replica %d holds %d sessions, model %d", step, r, s.Replicas[r].Sessions, held[r])
				}
			}
		}
	}
	if len(tab.entries) > max {
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
