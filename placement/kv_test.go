package placement

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

// TestTableFootprintMatchesEntries drives a table through random requests,
// footprint observations, removals, idle retirements, reloads and
// renumberings, and checks after every step that each replica's Footprint
// count is the sum of the footprints of its active conversations, found by
// walking the entries.
func TestTableFootprintMatchesEntries(t *testing.T) {
	const replicas = 4
	rng := rand.New(rand.NewPCG(3, 5))
	tab := NewTableWindow(10*time.Second, 40, 2*time.Second)
	now := time.Time{}
	for step := range 20000 {
		now = now.Add(time.Duration(rng.IntN(200)) * time.Millisecond)
		s := "s" + strconv.Itoa(rng.IntN(80))
		switch op := rng.IntN(20); {
		case op < 8:
			tab.Assign(s, rng.IntN(replicas), now)
		case op < 14:
			tab.Observe(s, rng.IntN(50000))
		case op < 16:
			tab.Remove(s)
		case op < 18:
			tab.Advance(now)
		case op == 18 && step%50 == 0:
			tab.Reconfigure(time.Duration(1+rng.IntN(12))*time.Second, 10+rng.IntN(40), time.Duration(1+rng.IntN(5000))*time.Millisecond, now)
		case op == 19 && step%50 == 1:
			to := rng.Perm(replicas)
			if rng.IntN(3) == 0 {
				to[rng.IntN(replicas)] = -1
			}
			tab.Renumber(to)
		}
		want := make([]int, replicas)
		active := make([]int, replicas)
		for i := tab.head; i != nilIndex; i = tab.entries[i].next {
			if e := tab.entries[i]; e.active {
				want[e.home] += tab.fp(i)
				active[e.home]++
			}
		}
		for r := range replicas {
			if got := tab.footprint(r); got != want[r] || tab.activeOn(r) != active[r] {
				t.Fatalf("step %d: replica %d Footprint %d Active %d, entries say %d and %d", step, r, got, tab.activeOn(r), want[r], active[r])
			}
		}
	}
	if tab.TypicalFootprint() <= 0 {
		t.Error("no typical footprint after thousands of observations")
	}
}

// TestWaitQueue: FIFO order, expiry from the front only past the timeout,
// and reuse of the backing array.
func TestWaitQueue(t *testing.T) {
	var q WaitQueue[int]
	t0 := time.Unix(0, 0)
	for i := range 100 {
		q.Push(i, t0.Add(time.Duration(i)*time.Second))
	}
	for i := range 60 {
		if v := q.Pop(); v != i {
			t.Fatalf("pop %d: got %d", i, v)
		}
	}
	if got := q.Expired(t0.Add(70*time.Second), 0, nil); len(got) != 0 {
		t.Errorf("a zero timeout expired %v", got)
	}
	got := q.Expired(t0.Add(70*time.Second), 5*time.Second, nil)
	if len(got) != 5 || got[0] != 60 || got[4] != 64 { // 65 has waited exactly 5 s
		t.Errorf("expired %v, want 60..64", got)
	}
	if v, since, ok := q.Front(); !ok || v != 65 || !since.Equal(t0.Add(65*time.Second)) {
		t.Errorf("front %d %v %v, want 65", v, since, ok)
	}
	for q.Len() > 0 {
		q.Pop()
	}
	q.Push(7, t0)
	if v, _, _ := q.Front(); v != 7 || q.Len() != 1 {
		t.Errorf("after draining, front %d len %d", v, q.Len())
	}
}

// TestWaitQueueRemove: a waiter that leaves from the front, the middle or
// the back keeps the others in order; Index sees the same positions.
func TestWaitQueueRemove(t *testing.T) {
	var q WaitQueue[int]
	t0 := time.Unix(0, 0)
	for i := range 6 {
		q.Push(i, t0)
	}
	q.Pop() // a popped head is not found again
	is := func(v int) func(int) bool { return func(x int) bool { return x == v } }
	for _, tc := range []struct{ v, at int }{{0, -1}, {3, 2}, {1, 0}, {5, 2}, {9, -1}} {
		if got := q.Index(is(tc.v)); got != tc.at {
			t.Errorf("Index(%d) = %d, want %d", tc.v, got, tc.at)
		}
		if got := q.Remove(is(tc.v)); got != tc.at {
			t.Errorf("Remove(%d) = %d, want %d", tc.v, got, tc.at)
		}
	}
	var rest []int
	for q.Len() > 0 {
		rest = append(rest, q.Pop())
	}
	if len(rest) != 2 || rest[0] != 2 || rest[1] != 4 {
		t.Errorf("left %v, want [2 4]", rest)
	}
}
