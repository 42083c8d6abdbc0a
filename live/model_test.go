package live

import (
	"bytes"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/hardware"
	"github.com/lm-warden/warden/placement"
)

func testModelState(t *testing.T, n int) *model {
	t.Helper()
	cfg := ModelCfg{Name: "m", SpillThreshold: Spill{Auto: true}, SessionTTL: Duration(time.Hour), MaxSessions: 100}
	for range n {
		cfg.Replicas = append(cfg.Replicas, "http://127.0.0.1:9")
	}
	m, err := newModel(cfg, http.DefaultClient, time.Second, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestEjectionCapAndBackoff(t *testing.T) {
	m := testModelState(t, 4)
	now := time.Unix(1000, 0)
	for i, want := range []bool{true, true, false} {
		if got := m.connectFailed(m.replicas[i], now); got != want {
			t.Errorf("replica %d ejected = %v, want %v (at most half of 4)", i, got, want)
		}
	}
	if got := m.replicas[0].ejectedUntil.Sub(now); got != ejectBase {
		t.Errorf("first back-off %v, want %v", got, ejectBase)
	}
	// Consecutive failures double the back-off, up to the cap.
	rep := m.replicas[0]
	for range 10 {
		m.connectFailed(rep, now)
	}
	if got := rep.ejectedUntil.Sub(now); got != ejectMax {
		t.Errorf("back-off after 11 failures %v, want the cap %v", got, ejectMax)
	}
	m.succeeded(rep)
	if rep.failures.Load() != 0 {
		t.Error("a success must reset the failure count")
	}
	one := testModelState(t, 1)
	if one.connectFailed(one.replicas[0], now) {
		t.Error("the only replica of a model must never be ejected")
	}
}

func TestWarmUpIsGradual(t *testing.T) {
	m := testModelState(t, 2)
	rep := m.replicas[0]
	start := time.Unix(1000, 0)
	m.connectFailed(rep, start)
	if m.admit(rep, start, false) {
		t.Fatal("an ejected replica was admitted")
	}
	admitted := func(at time.Time) int {
		n := 0
		for range 1000 {
			if m.admit(rep, at, false) {
				n++
			}
		}
		return n
	}
	back := rep.ejectedUntil
	early, mid, late := admitted(back), admitted(back.Add(warmup/2)), admitted(back.Add(warmup))
	if early < 50 || early > 150 || mid < 450 || mid > 650 || late != 1000 {
		t.Errorf("admitted per 1000 picks: %d at the start of warm-up, %d half-way, %d after; want ~100, ~550, 1000", early, mid, late)
	}
}

func TestFillFallsBackToLocalCounts(t *testing.T) {
	m := testModelState(t, 2)
	now := time.Now()
	// Replica 0 has a fresh scrape, replica 1 none.
	m.replicas[0].server.last.Store(&ScrapeResult{Seq: 1, OK: now, Healthy: true,
		Engines: []EngineStats{{Running: 5, Waiting: 1, KVUsage: 0.6}}})
	m.replicas[1].inFlight.Store(300)
	m.mu.Lock()
	m.fill(now, false)
	s := m.snap
	m.mu.Unlock()
	r0, r1 := s.Replicas[0], s.Replicas[1]
	if r0.Running != 5 || r0.Waiting != 1 || r0.KVUsage != 0.6 {
		t.Errorf("fresh replica %+v, want the scraped figures", r0)
	}
	if r1.Running != DefaultMaxNumSeqs || r1.Waiting != 300-DefaultMaxNumSeqs || r1.KVUsage != 0.6 || !r1.Healthy {
		t.Errorf("unscraped replica %+v, want local counts (running 256, waiting 44), the fresh mean KV use, healthy", r1)
	}
}

// TestWarmUpKeepsStickySessions: when an ejected replica comes back, its
// warm-up share throttles new sessions only; the sessions homed there stay
// on it from the first pick of the warm-up (issue 13, fault 3).
func TestWarmUpKeepsStickySessions(t *testing.T) {
	m := testModelState(t, 2)
	rep := m.replicas[0]
	start := time.Unix(1000, 0)
	sessions := make([]string, 40)
	for i := range sessions {
		sessions[i] = fmt.Sprintf("home0-%d", i)
		m.table.Assign(sessions[i], 0, start)
	}
	m.connectFailed(rep, start)
	back := rep.ejectedUntil
	for i, s := range sessions {
		r := placement.Request{Session: s, Model: "m", Pinned: placement.NoPin}
		p, err := m.pick(&r, -1, back.Add(time.Duration(i)*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		p.rep.inFlight.Add(-1)
		if p.Replica != 0 || p.Reason != placement.ReasonSticky {
			t.Fatalf("session %d homed on the warming replica went to %d (%s), want 0 sticky", i, p.Replica, p.Reason)
		}
	}
	// New sessions are still throttled: at the start of warm-up about a
	// tenth of the picks may see replica 0.
	onWarm := 0
	for i := range 100 {
		r := placement.Request{Session: fmt.Sprintf("new-%d", i), Model: "m", Pinned: placement.NoPin}
		p, err := m.pick(&r, -1, back.Add(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		p.rep.inFlight.Add(-1)
		if p.Replica == 0 {
			onWarm++
		}
	}
	if onWarm > 30 {
		t.Errorf("%d of 100 new sessions went to the warming replica, want about 10", onWarm)
	}
}

// TestGPUDefaultMaxNumSeqs: a model with gpu set and no max_num_seqs
// anywhere takes vLLM's default for that GPU, by hardware's rule (the one
// the simulator and the planner size with): 1024 on >= 70 GiB GPUs other
// than the A100, else 256 (issue 13, fault 6).
func TestGPUDefaultMaxNumSeqs(t *testing.T) {
	qwen, err := hardware.LookupModel("Qwen/Qwen3-4B-Instruct-2507")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{"RTX A4000": 256, "L40S": 256, "A100 80GB": 256, "H100 SXM": 1024, "H200": 1024} {
		m, err := newModel(ModelCfg{Name: "m", Replicas: []string{"http://127.0.0.1:1"}, GPU: name,
			SpillThreshold: Spill{Auto: true}, SessionTTL: Duration(time.Minute), MaxSessions: 10}, http.DefaultClient, time.Second, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if got, src := m.maxNumSeqs(); got != want || src != "gpu" {
			t.Errorf("%s: max_num_seqs %d from %s, want %d from gpu", name, got, src, want)
		}
		g, err := hardware.LookupGPU(name)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := hardware.SizeKV(hardware.Deployment{GPU: g, Model: qwen})
		if err != nil {
			t.Fatal(err)
		}
		if kv.MaxNumSeqs != want {
			t.Errorf("%s: hardware.SizeKV resolves max_num_seqs %d, the proxy %d: one rule, please", name, kv.MaxNumSeqs, want)
		}
	}
}

// TestUnknownMaxNumSeqsWarns: a server that does not expose max_num_seqs
// gets a warning in the log (once, after the first scrape) and in Status;
// with gpu set, vLLM's default for that GPU is used and said so.
func TestUnknownMaxNumSeqsWarns(t *testing.T) {
	for _, tc := range []struct {
		gpu, src string
		want     int
	}{{"", "default", 256}, {"H100 SXM", "gpu", 1024}} {
		cfg := ModelCfg{Name: "m", SpillThreshold: Spill{Auto: true}, SessionTTL: Duration(time.Hour), MaxSessions: 100,
			Replicas: []string{"http://127.0.0.1:9"}, GPU: tc.gpu}
		m, err := newModel(cfg, http.DefaultClient, time.Second, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var logBuf bytes.Buffer
		log := slog.New(slog.NewTextHandler(&logBuf, nil))
		m.warnMaxNumSeqs(log) // no scrape yet: the server may still expose it
		if logBuf.Len() != 0 {
			t.Errorf("warned before the first scrape: %s", logBuf.String())
		}
		m.servers[0].last.Store(&ScrapeResult{Seq: 1, OK: time.Now(), Healthy: true, Engines: []EngineStats{{Running: 1}}})
		m.warnMaxNumSeqs(log)
		m.warnMaxNumSeqs(log)
		if n := strings.Count(logBuf.String(), "max_num_seqs is not exposed"); n != 1 {
			t.Errorf("gpu %q: %d warnings logged, want 1: %s", tc.gpu, n, logBuf.String())
		}
		st := m.status(time.Now())
		if st.MaxNumSeqs != tc.want || st.MaxNumSeqsSource != tc.src || st.SpillThreshold != tc.want/4 ||
			len(st.Warnings) != 1 || !strings.Contains(st.Warnings[0], "max_num_seqs") {
			t.Errorf("gpu %q: status max_num_seqs %d (%s) spill %d warnings %q, want %d (%s), spill %d, one warning",
				tc.gpu, st.MaxNumSeqs, st.MaxNumSeqsSource, st.SpillThreshold, st.Warnings, tc.want, tc.src, tc.want/4)
		}
		// Exposed by the server: no warning.
		m.servers[0].last.Store(&ScrapeResult{Seq: 2, OK: time.Now(), Healthy: true, Engines: []EngineStats{{MaxNumSeqs: 32}}})
		if st := m.status(time.Now()); st.MaxNumSeqs != 32 || len(st.Warnings) != 0 {
			t.Errorf("exposed max_num_seqs: %d warnings %q, want 32 and none", st.MaxNumSeqs, st.Warnings)
		}
	}
}

// Every placement reason has its own counter slot, its own
// warden_requests_total series and a name that round-trips; "retried" is
// one more. A reason added to placement shows up here without live
// changing.
func TestCountedReasonsCoverPlacement(t *testing.T) {
	reasons := placement.Reasons()
	if len(reasons) != placement.NumReasons {
		t.Fatalf("placement.Reasons() has %d reasons, NumReasons %d", len(reasons), placement.NumReasons)
	}
	m := testModelState(t, 1)
	rep := m.replicas[0]
	if len(rep.byReason) != len(reasons)+1 {
		t.Fatalf("a replica counts %d reasons, want placement's %d and retried", len(rep.byReason), len(reasons))
	}
	seen := map[int]string{}
	for _, r := range append(reasons[:len(reasons):len(reasons)], placement.Reason(255)) {
		name := r.String()
		if r == 255 {
			name = "retried"
		}
		i := reasonIndex(name)
		if prev, dup := seen[i]; dup {
			t.Errorf("reasons %q and %q share counter slot %d", prev, name, i)
		}
		seen[i] = name
		if got := reasonName(i); got != name {
			t.Errorf("reasonName(reasonIndex(%q)) = %q", name, got)
		}
	}
	o := newObserver(func() *routing { return nil })
	o.initModel(m)
	fams, err := o.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]bool{}
	for _, f := range fams {
		if f.GetName() != "warden_requests_total" {
			continue
		}
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "reason" {
					labels[l.GetValue()] = true
				}
			}
		}
	}
	for _, r := range reasons {
		if !labels[r.String()] {
			t.Errorf("warden_requests_total has no series for reason %q", r)
		}
	}
	if !labels["retried"] || len(labels) != len(reasons)+1 {
		t.Errorf("warden_requests_total reasons %v, want placement's %d and retried", labels, len(reasons))
	}
}

// TestStayedCountsTheFirstReplica: "stayed %" is the simulator's rule
// (placement.Stay): of the later turns, those served by the replica of the
// session's first turn. A session re-homed when that replica was ejected
// has not stayed while it follows its new home.
func TestStayedCountsTheFirstReplica(t *testing.T) {
	m := testModelState(t, 2)
	start := time.Unix(1000, 0)
	var sim placement.StayCount // the simulator's count of the same turns
	first := -1
	turn := func(n int, at time.Time) int {
		t.Helper()
		r := placement.Request{Session: "s", Model: "m", Pinned: placement.NoPin}
		p, err := m.pick(&r, -1, at)
		if err != nil {
			t.Fatal(err)
		}
		p.rep.inFlight.Add(-1)
		if n == 0 {
			first = p.Replica
		}
		sim.Add(n > 0, first, p.Replica)
		return p.Replica
	}
	turn(0, start)
	turn(1, start.Add(time.Second)) // sticky: stayed
	m.connectFailed(m.replicas[first], start.Add(2*time.Second))
	if moved := turn(2, start.Add(2500*time.Millisecond)); moved == first { // re-homed
		t.Fatalf("turn 2 went to the ejected replica %d", first)
	}
	back := start.Add(ejectMax + warmup + time.Minute)
	if r := turn(3, back); r == first { // follows its new home
		t.Fatalf("turn 3 went back to replica %d", first)
	}
	if got, want := m.laterTurns.Load(), sim.Later; got != want || got != 3 {
		t.Errorf("later turns %d, simulator %d, want 3", got, want)
	}
	if got, want := m.laterHome.Load(), sim.Home; got != want || got != 1 {
		t.Errorf("later turns on the first replica %d, simulator %d, want 1 (turn 1 only)", got, want)
	}
}

// The consecutive-failure counters saturate: a replica whose ejection the
// "never more than half" rule refused for a very long run of 5xx is still
// ejected once the rule allows it (a wrapped counter would read negative
// and spare it for another 2^31 failures).
func TestFailureCountersDoNotWrap(t *testing.T) {
	m := testModelState(t, 2)
	rep, other := m.replicas[0], m.replicas[1]
	now := time.Unix(1000, 0)
	if !m.connectFailed(other, now) {
		t.Fatal("the other replica was not ejected")
	}
	rep.strikes.Store(math.MaxInt32 - 2) // stands for ~2^31 refused strikes
	rep.failures.Store(math.MaxInt32 - 2)
	for range 5 {
		if m.outlier(rep, now) {
			t.Fatal("ejected while the other replica is out: more than half")
		}
		if rep.strikes.Load() < 0 || rep.failures.Load() < 0 {
			t.Fatalf("a counter wrapped: strikes %d failures %d", rep.strikes.Load(), rep.failures.Load())
		}
	}
	later := now.Add(ejectMax + time.Second) // the other is back
	if !m.outlier(rep, later) {
		t.Errorf("not ejected after the other came back (strikes %d)", rep.strikes.Load())
	}
	if got := rep.ejectedUntil.Sub(later); got != ejectMax {
		t.Errorf("back-off %v after a long run of failures, want the cap %v", got, ejectMax)
	}
}

// newModel builds the state of one configured model.
func newModel(cfg ModelCfg, client *http.Client, interval, timeout time.Duration) (*model, error) {
	return newModelAfter(cfg, client, interval, timeout, nil)
}
