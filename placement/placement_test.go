package placement

import (
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// farm returns a snapshot of n healthy, idle replicas.
func farm(n, maxNumSeqs int) *Snapshot {
	s := &Snapshot{MaxNumSeqs: maxNumSeqs, Replicas: make([]Replica, n)}
	for i := range s.Replicas {
		s.Replicas[i] = Replica{ID: i, Healthy: true}
	}
	return s
}

func pick(t *testing.T, p Policy, r Request, s *Snapshot, now time.Time) Decision {
	t.Helper()
	d, err := p.Pick(&r, s, now)
	if err != nil {
		t.Fatalf("Pick(%+v): %v", r, err)
	}
	return d
}

func TestReasonRoundTrip(t *testing.T) {
	for r := Reason(0); r < numReasons; r++ {
		got, err := ParseReason(r.String())
		if err != nil || got != r {
			t.Errorf("ParseReason(%q) = %v, %v; want %v", r.String(), got, err, r)
		}
	}
	if _, err := ParseReason("lucky"); err == nil || !strings.Contains(err.Error(), "parent") {
		t.Errorf("ParseReason(lucky) error = %v, want one listing every reason", err)
	}
	if got := Reason(200).String(); got != "Reason(200)" {
		t.Errorf("Reason(200).String() = %q", got)
	}
}

func TestNew(t *testing.T) {
	for _, name := range Strategies() {
		p, err := New(name, Config{})
		if err != nil || p == nil {
			t.Errorf("New(%q) = %v, %v", name, p, err)
		}
	}
	_, err := New("round-robin", Config{})
	if err == nil || !strings.Contains(err.Error(), `"round-robin" (want one of `+strings.Join(Strategies(), ", ")+`)`) {
		t.Errorf("New(round-robin) error = %v", err)
	}
	if _, err := New(StrategyAffinity, Config{MaxSessions: -1}); err == nil || !strings.Contains(err.Error(), "MaxSessions") {
		t.Errorf("New with MaxSessions -1: error = %v, want one naming MaxSessions", err)
	}
	if _, err := New(StrategyAffinity, Config{SessionTTL: -time.Second}); err == nil || !strings.Contains(err.Error(), "SessionTTL") {
		t.Errorf("New with a negative TTL: error = %v, want one naming SessionTTL", err)
	}
	p, _ := New(StrategyAffinity, Config{SessionTTL: time.Minute, MaxSessions: 7})
	tab := p.(*Affinity).Table()
	if tab.TTL() != time.Minute || tab.MaxSessions() != 7 {
		t.Errorf("table TTL %v cap %d, want 1m and 7", tab.TTL(), tab.MaxSessions())
	}
}

func TestSpillThreshold(t *testing.T) {
	tests := []struct {
		in         string
		maxNumSeqs int
		want       int
		wantErr    bool
	}{
		{"auto", 32, 8, false},
		{"auto", 256, 64, false},
		{"auto", 3, 1, false}, // max(1, 3/4)
		{"auto", 0, 1, false},
		{"12", 32, 12, false},
		{"0", 32, 0, true}, // invalid: see TestSpillThresholdZero
		{"-1", 32, 0, true},
		{"", 32, 0, true},
		{"eight", 32, 0, true},
	}
	for _, tt := range tests {
		th, err := ParseSpillThreshold(tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("ParseSpillThreshold(%q) error = %v, wantErr %v", tt.in, err, tt.wantErr)
			continue
		}
		if err != nil {
			continue
		}
		if got := th.Resolve(tt.maxNumSeqs); got != tt.want {
			t.Errorf("%q.Resolve(%d) = %d, want %d", tt.in, tt.maxNumSeqs, got, tt.want)
		}
		if th.String() != tt.in {
			t.Errorf("String() = %q, want %q", th.String(), tt.in)
		}
		var back SpillThreshold
		text, _ := th.MarshalText()
		if err := back.UnmarshalText(text); err != nil || back != th {
			t.Errorf("text round trip of %q: %v, %v", tt.in, back, err)
		}
	}
	var zero SpillThreshold
	if !zero.Auto() || zero.String() != "auto" {
		t.Errorf("zero SpillThreshold is %q, want auto", zero)
	}
}

// A spill threshold of 0 is refused, with one message that the planner,
// the simulator and the proxy all print after their field's name.
func TestSpillThresholdZero(t *testing.T) {
	_, err := ParseSpillThreshold("0")
	if err == nil {
		t.Fatal("spill threshold 0 accepted")
	}
	if got, want := err.Error(), SpillThresholdError("0"); got != want {
		t.Errorf("error %q, want %q", got, want)
	}
	if !strings.Contains(err.Error(), "positive integer") {
		t.Errorf("error %q does not say what is wanted", err)
	}
	if SpillAt(0).Resolve(32) != 1 || SpillAt(-4).Resolve(32) != 1 {
		t.Error("SpillAt below 1 must be 1: the threshold is at least one request in flight")
	}
}

func TestFNV1a(t *testing.T) {
	// Reference values of 64-bit FNV-1a.
	for s, want := range map[string]uint64{"": 0xcbf29ce484222325, "a": 0xaf63dc4c8601ec8c, "foobar": 0x85944171f73967e8} {
		if got := fnv1a64(s); got != want {
			t.Errorf("fnv1a64(%q) = %#x, want %#x", s, got, want)
		}
	}
}

// TestHashRendezvous: an unhealthy replica moves only its own sessions,
// and sessions spread evenly.
func TestHashRendezvous(t *testing.T) {
	const n, sessions = 8, 20000
	s := farm(n, 32)
	var h Hash
	base := make([]int, sessions)
	perReplica := make([]int, n)
	for i := range base {
		d := pick(t, &h, Request{Session: "s" + strconv.Itoa(i), Pinned: NoPin}, s, t0)
		base[i] = d.Replica
		perReplica[d.Replica]++
	}
	for r, c := range perReplica {
		if c < sessions/n*8/10 || c > sessions/n*12/10 {
			t.Errorf("replica %d holds %d of %d sessions, want %d ±20%%", r, c, sessions, sessions/n)
		}
	}
	for down := range n {
		s.Replicas[down].Healthy = false
		for i, was := range base {
			d := pick(t, &h, Request{Session: "s" + strconv.Itoa(i), Pinned: NoPin}, s, t0)
			if was != down && d.Replica != was {
				t.Fatalf("replica %d down: session s%d moved from %d to %d", down, i, was, d.Replica)
			}
			if d.Replica == down {
				t.Fatalf("picked unhealthy replica %d", down)
			}
		}
		s.Replicas[down].Healthy = true
	}
}

func TestNoHealthyReplica(t *testing.T) {
	down := farm(3, 32)
	for i := range down.Replicas {
		down.Replicas[i].Healthy = false
	}
	snaps := []struct {
		name string
		s    *Snapshot
	}{{"no replicas", farm(0, 32)}, {"all down", down}}
	for _, strategy := range Strategies() {
		for _, sn := range snaps {
			name, s := sn.name, sn.s
			for _, disabled := range []bool{false, true} {
				p, _ := New(strategy, Config{Disabled: disabled})
				_, err := p.Pick(&Request{Session: "a", Pinned: 0}, s, t0)
				if !errors.Is(err, ErrNoHealthyReplica) {
					t.Errorf("%s (disabled=%v), %s: error %v, want ErrNoHealthyReplica", strategy, disabled, name, err)
				}
			}
		}
	}
}

// TestAffinityOffIsLeastLoaded drives an affinity policy switched off and
// a LeastLoaded through the same random sequence: decisions must match.
func TestAffinityOffIsLeastLoaded(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	off := NewAffinity(Config{Disabled: true})
	var ll LeastLoaded
	s := farm(5, 16)
	for step := range 5000 {
		if rng.IntN(10) == 0 {
			for i := range s.Replicas {
				r := &s.Replicas[i]
				r.Running, r.Waiting, r.InFlight = rng.IntN(20), rng.IntN(5), rng.IntN(20)
				r.Healthy = rng.IntN(8) != 0
			}
			s.Generation++
		}
		req := Request{Session: "s" + strconv.Itoa(rng.IntN(50)), Pinned: rng.IntN(12) - 6}
		if req.Pinned < 0 {
			req.Pinned = NoPin
		}
		d1, err1 := off.Pick(&req, s, t0)
		d2, err2 := ll.Pick(&req, s, t0)
		if d1 != d2 || (err1 == nil) != (err2 == nil) {
			t.Fatalf("step %d: affinity off %v %v, least-loaded %v %v", step, d1, err1, d2, err2)
		}
	}
	if off.Table().Len() != 0 {
		t.Errorf("disabled affinity remembered %d sessions", off.Table().Len())
	}
}

func TestAffinityRehomesOutOfRange(t *testing.T) {
	a := NewAffinity(Config{})
	big := farm(4, 32)
	for i := range 3 {
		big.Replicas[i].InFlight = 5
	}
	if d := pick(t, a, Request{Session: "x", Pinned: NoPin}, big, t0); d != (Decision{Replica: 3, Reason: ReasonNew}) {
		t.Fatalf("first turn: %v, want 3 new", d)
	}
	small := farm(2, 32)
	if d := pick(t, a, Request{Session: "x", Pinned: NoPin}, small, t0); d != (Decision{Replica: 0, Reason: ReasonNew}) {
		t.Fatalf("home 3 gone: %v, want 0 new", d)
	}
	if h, _ := a.Table().Home("x", t0); h != 0 {
		t.Errorf("home after re-homing = %d, want 0", h)
	}
	if c := a.Table().Counters(); c[3].Sessions != 0 || c[0].Sessions != 1 {
		t.Errorf("sessions held: %+v", c)
	}
}

func TestAffinityEmptySessionIsNotRemembered(t *testing.T) {
	a := NewAffinity(Config{})
	s := farm(2, 32)
	for range 3 {
		if d := pick(t, a, Request{Pinned: NoPin}, s, t0); d.Reason != ReasonNew {
			t.Fatalf("empty session: %v, want reason new", d)
		}
	}
	pick(t, a, Request{Pinned: 1}, s, t0)
	if a.Table().Len() != 0 {
		t.Errorf("table holds %d sessions, want 0", a.Table().Len())
	}
}

func TestAffinityScores(t *testing.T) {
	a := NewAffinity(Config{})
	s := farm(3, 32)
	s.Replicas[0].InFlight, s.Replicas[0].KVUsage = 4, 0.5
	s.Replicas[1].InFlight, s.Replicas[1].KVUsage = 2, math.NaN()
	s.Replicas[2].Healthy = false
	a.Table().Assign("a", 1, t0)
	got := a.Scores(s, nil)
	want := []float64{1 + 0.5 + 0, 0.5 + 0 + 1, math.Inf(1)}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("score[%d] = %v, want %v", i, got[i], want[i])
		}
	}
}

func TestStickyPathDoesNotAllocate(t *testing.T) {
	a := NewAffinity(Config{})
	s := farm(8, 32)
	r := Request{Session: "conversation-42", Pinned: NoPin}
	now := t0
	if _, err := a.Pick(&r, s, now); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Second)
		if d, _ := a.Pick(&r, s, now); d.Reason != ReasonSticky {
			t.Fatalf("reason %v, want sticky", d.Reason)
		}
	})
	if allocs != 0 {
		t.Errorf("sticky Pick allocates %v times, want 0", allocs)
	}
	var ll LeastLoaded
	var h Hash
	for name, p := range map[string]Policy{"least-loaded": &ll, "hash": &h} {
		p.Pick(&r, s, now)
		if n := testing.AllocsPerRun(1000, func() { p.Pick(&r, s, now) }); n != 0 {
			t.Errorf("%s Pick allocates %v times, want 0", name, n)
		}
	}
}

func TestLeastLoadedScores(t *testing.T) {
	var ll LeastLoaded
	s := farm(3, 32)
	s.Replicas[1].Waiting, s.Replicas[1].Running = 1, 2
	s.Replicas[2].Healthy = false
	pick(t, &ll, Request{Pinned: NoPin}, s, t0) // replica 0, local waiting +1
	got := ll.Scores(s, nil)
	if want := []int{4, 6, -1}; !equalInts(got, want) {
		t.Errorf("Scores = %v, want %v", got, want)
	}
	s.Generation++
	if got, want := ll.Scores(s, nil), []int{0, 6, -1}; !equalInts(got, want) {
		t.Errorf("Scores after a scrape = %v, want %v", got, want)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A request that failed at its session's home a moment ago (the proxy's
// retry) spills to another replica; the session keeps its home.
func TestFailedHomeKeepsHome(t *testing.T) {
	p, err := New("affinity", Config{})
	if err != nil {
		t.Fatal(err)
	}
	snap := func(unhealthy int) *Snapshot {
		s := &Snapshot{MaxNumSeqs: 32}
		for i := range 3 {
			s.Replicas = append(s.Replicas, Replica{ID: i, Healthy: i != unhealthy})
		}
		return s
	}
	now := time.Unix(0, 0)
	req := &Request{Session: "s", Pinned: NoPin}
	first, err := p.Pick(req, snap(-1), now)
	if err != nil || first.Reason != ReasonNew {
		t.Fatalf("first turn: %+v, %v", first, err)
	}
	home := first.Replica
	retry := &Request{Session: "s", Pinned: NoPin, Failed: []int{home}}
	d, err := p.Pick(retry, snap(home), now)
	if err != nil || d.Replica == home || d.Reason != ReasonSpill {
		t.Fatalf("retry after home %d failed: %+v, %v; want a spill elsewhere", home, d, err)
	}
	d, err = p.Pick(req, snap(-1), now)
	if err != nil || d.Replica != home || d.Reason != ReasonSticky {
		t.Fatalf("next turn: %+v, %v; want sticky on %d", d, err, home)
	}
	// Unhealthy without having failed this request: the session is re-homed.
	d, err = p.Pick(req, snap(home), now)
	if err != nil || d.Replica == home || d.Reason != ReasonNew {
		t.Fatalf("home unhealthy: %+v, %v; want re-homed as new", d, err)
	}
	// Only replica left failed: no healthy replica.
	only := &Snapshot{MaxNumSeqs: 32, Replicas: []Replica{{ID: 0}}}
	q, _ := New("affinity", Config{})
	if _, err := q.Pick(&Request{Session: "x", Pinned: NoPin}, &Snapshot{MaxNumSeqs: 32, Replicas: []Replica{{ID: 0, Healthy: true}}}, now); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Pick(&Request{Session: "x", Pinned: NoPin, Failed: []int{0}}, only, now); !errors.Is(err, ErrNoHealthyReplica) {
		t.Fatalf("failed home, nothing else healthy: %v, want ErrNoHealthyReplica", err)
	}
}

// TestRendezvousByKey: with Replica.Key set, the replica a session hashes
// to does not depend on the order of the list, and a replica going down
// moves only its own sessions.
func TestRendezvousByKey(t *testing.T) {
	names := []string{"http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000#1"}
	snap := func(order []int, down int) *Snapshot {
		s := &Snapshot{}
		for i, k := range order {
			s.Replicas = append(s.Replicas, Replica{ID: i, Key: NameKey(names[k]), Healthy: k != down})
		}
		return s
	}
	for _, order := range [][]int{{2, 1, 0}, {1, 2, 0}, {0, 2, 1}} {
		for i := range 200 {
			session := "s" + string(rune('a'+i%26)) + string(rune('0'+i/26))
			a, b := snap([]int{0, 1, 2}, -1), snap(order, -1)
			ka, kb := a.Replicas[Rendezvous(session, a)].Key, b.Replicas[Rendezvous(session, b)].Key
			if ka != kb {
				t.Fatalf("%s: order %v hashes to another replica", session, order)
			}
			d := snap(order, 1)
			if kd := d.Replicas[Rendezvous(session, d)].Key; ka != NameKey(names[1]) && kd != ka {
				t.Fatalf("%s: a replica it was not on went down, and it moved", session)
			}
		}
	}
}
