package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lm-warden/warden/metrics"
	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/traces"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// checkRun verifies the invariants that must hold after any run.
func checkRun(t *testing.T, r *run, rows []Row) {
	t.Helper()
	var queried, accounted, pending int64
	for _, rep := range r.reps {
		if err := checkPool(rep); err != nil {
			t.Errorf("replica %d: %v", rep.id, err)
		}
		st := rep.stats
		queried += st.admitQueries + st.preemptedQueries
		accounted += st.admitHits + st.preemptedHits + st.prefillComputed + st.prefillAbandoned
		for _, s := range rep.running {
			if !s.aborted && s.computed < s.admitTokens {
				pending += int64(s.admitTokens - s.computed)
			}
		}
		if miss := st.miss.Total(); miss != st.admitQueries-st.admitHits {
			t.Errorf("replica %d: miss classes sum to %d, first lookups missed %d tokens", rep.id, miss, st.admitQueries-st.admitHits)
		}
		if r.cfg.countEveryLookup {
			if st.queries < st.admitQueries || st.hits < st.admitHits {
				t.Errorf("replica %d: every-lookup counters %d/%d below the admission counters %d/%d", rep.id, st.hits, st.queries, st.admitHits, st.admitQueries)
			}
		} else if st.queries != st.admitQueries || st.hits != st.admitHits {
			t.Errorf("replica %d: counters at admission %d/%d differ from the admission counts %d/%d", rep.id, st.hits, st.queries, st.admitHits, st.admitQueries)
		}
	}
	// Token accounting: every token looked up was hit, computed, or left
	// uncomputed by a preemption or cut, or is still to be computed.
	if queried != accounted+pending {
		t.Errorf("token accounting: queried %d != hits+computed+abandoned %d + pending %d", queried, accounted, pending)
	}
	// Every request sent finished or was reported unfinished.
	var unfinished int64
	for _, row := range rows {
		unfinished += row.Unfinished
	}
	if sent := int64(r.nextID); sent != r.rt.finished+unfinished {
		t.Errorf("requests: %d sent, %d finished + %d unfinished", sent, r.rt.finished, unfinished)
	}
}

func TestPropertyInvariants(t *testing.T) {
	small := traces.DefaultWorkload()
	small.FirstMessageTokens, small.Turns = 3000, 4
	long := traces.DefaultWorkload()
	long.FirstMessageTokens, long.NewTokensPerTurn, long.ThinkTime = 20000, 2000, 2*time.Second
	sub := traces.DefaultWorkload()
	sub.SubagentProbability = 0.3
	tight := mustDefaultFarm(t)
	tight2 := *tight
	tight2.NumGPUBlocks = 3000 // 48k tokens for sessions of up to 35k: preemptions
	tight2.Spec.VLLM.MaxNumBatchedTokens = 512
	// Without scheduler_reserve_full_isl (vLLM before 0.22) chunked prefill
	// over-admits and decode preempts; with it (tight3, counting every
	// lookup as before 0.24) admission waits instead.
	tight2.Spec.VLLM.ReserveFullISL = "false"
	tight3 := *tight
	tight3.NumGPUBlocks = 3000
	tight3.Spec.VLLM.MaxNumBatchedTokens = 512
	tight3.Behaviour.StatsAtAdmission = false

	cases := []struct {
		farm     *Farm
		w        traces.Workload
		sessions []int
	}{
		{mustDefaultFarm(t), traces.DefaultWorkload(), []int{4, 24}},
		{&tight2, long, []int{6, 12}},
		{mustExampleFarm(t, "rtx5090-gemma3-27b-int4.yaml"), small, []int{10}},
		{mustExampleFarm(t, "h100-llama31-70b-tp4.yaml"), sub, []int{16}},
		{&tight3, long, []int{6, 12}},
	}
	for i, c := range cases {
		for _, seed := range []uint64{1, 7} {
			for _, strategy := range placement.Strategies() {
				if seed != 1 && peerRouter(strategy) {
					continue // the peers' routers once per case: the suite's time
				}
				t.Run(fmt.Sprintf("case%d/seed%d/%s", i, seed, strategy), func(t *testing.T) {
					e, err := Experiment{Farm: c.farm, Workload: c.w, Sessions: c.sessions, Duration: 40 * time.Second, Seed: seed}.withDefaults()
					if err != nil {
						t.Fatal(err)
					}
					rows, r, err := runStrategy(context.Background(), e, strategy, nil)
					if err != nil {
						t.Fatal(err)
					}
					checkRun(t, r, rows)
					if i == 1 && seed == 1 && strategy == placement.StrategyLeastLoaded {
						var pre int64
						for _, row := range rows {
							pre += row.Preemptions
						}
						if pre == 0 {
							t.Error("the tight farm saw no preemption: the case does not exercise them")
						}
					}
				})
			}
		}
	}
}

// TestKPIsMatchDirectCounts checks that the columns computed by the PromQL
// expressions of metrics/kpi.promql over the simulated series equal the
// values counted directly.
func TestKPIsMatchDirectCounts(t *testing.T) {
	f := mustDefaultFarm(t)
	rep, err := Run(context.Background(), Experiment{
		Farm: f, Strategies: placement.Strategies(), Sessions: []int{4, 16}, Duration: time.Minute, Seed: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	near := func(got Float, want float64) bool {
		return math.Abs(float64(got)-want) <= 1e-9*math.Max(1, math.Abs(want))
	}
	for _, row := range rep.Rows {
		d := row.direct
		name := fmt.Sprintf("%s/%d", row.Strategy, row.Sessions)
		if want := pct(d.hits, d.queries); float64(row.PrefixHitPct) != want {
			t.Errorf("%s: PromQL hit %% = %v, counted %v", name, row.PrefixHitPct, want)
		}
		if want := pct(d.home, d.laterTurns); !near(row.StayedPct, want) {
			t.Errorf("%s: PromQL stayed %% = %v, counted %v", name, row.StayedPct, want)
		}
		win := float64(row.DurationS)
		if want := float64(d.sessionsCompleted) * 3600 / win; !near(row.SessionsPerHour, want) {
			t.Errorf("%s: PromQL sessions/h = %v, counted %v", name, row.SessionsPerHour, want)
		}
		if want := float64(d.outputTokens) * 60 / win; !near(row.OutputTokensPerMin, want) {
			t.Errorf("%s: PromQL output tokens/min = %v, counted %v", name, row.OutputTokensPerMin, want)
		}
		if !near(row.ReplicasBusy, d.busyMean) {
			t.Errorf("%s: PromQL replicas busy = %v, counted %v", name, row.ReplicasBusy, d.busyMean)
		}
		// TTFB quantiles come from warden_ttfb_seconds' native histogram
		// (schema 7, buckets 0.54% wide): within 2% of the exact quantile
		// of the step's TTFBs (linear interpolation, result.go's quantile).
		for _, q := range []struct {
			what string
			got  Float
			want float64
		}{{"p50", row.TTFBP50, d.ttfbP50}, {"p95", row.TTFBP95, d.ttfbP95}} {
			if rel := math.Abs(float64(q.got)-q.want) / q.want; !(rel <= 0.02) {
				t.Errorf("%s: PromQL TTFB %s %v vs exact %v: %.2f%% off, want within 2%%", name, q.what, q.got, q.want, 100*rel)
			} else {
				t.Logf("%s: TTFB %s PromQL %.6g exact %.6g (%+.3f%%)", name, q.what, q.got, q.want, 100*(float64(q.got)-q.want)/q.want)
			}
		}
		// The miss classes count each request's first lookup, as the
		// counters do from vLLM 0.27; before, they count every lookup, so
		// the classes match the admission counts instead.
		if misses := row.MissTokens.Total(); misses != d.admitQ-d.admitH {
			t.Errorf("%s: miss classes %d != queries-hits at admission %d", name, misses, d.admitQ-d.admitH)
		}
		if f.Behaviour.StatsAtAdmission && (d.queries != d.admitQ || d.hits != d.admitH) {
			t.Errorf("%s: counted at admission, yet queries/hits %d/%d != at admission %d/%d", name, d.queries, d.hits, d.admitQ, d.admitH)
		}
		for i, rr := range row.Replicas {
			if !near(rr.HitPct, d.replicaHitPct[i]) && !math.IsNaN(d.replicaHitPct[i]) {
				t.Errorf("%s: replica %d hit %v vs %v", name, i, rr.HitPct, d.replicaHitPct[i])
			}
		}
	}
}

// TestPerEngineKPI checks the per-replica PromQL KPI against the direct
// per-replica hit rate.
func TestPerEngineKPI(t *testing.T) {
	f := mustDefaultFarm(t)
	e, err := Experiment{Farm: f, Sessions: []int{8}, Duration: 30 * time.Second, Seed: 5}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	rows, r, err := runStrategy(context.Background(), e, placement.StrategyAffinity, nil)
	if err != nil {
		t.Fatal(err)
	}
	kpi, err := newEvaluatorForTest().KPIValues(context.Background(), r.rec.store, r.model, time.UnixMilli(30_000), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for i, rr := range rows[0].Replicas {
		got := kpi[fmt.Sprintf(`prefix_hit_pct_by_engine{engine="%d"}`, i)]
		if want := rows[0].direct.replicaHitPct[i]; got != want && !(math.IsNaN(got) && math.IsNaN(want)) {
			t.Errorf("replica %d: PromQL %v, counted %v (row %v)", i, got, want, rr.HitPct)
		}
	}
}

func TestSameSeedSameJSON(t *testing.T) {
	f := mustDefaultFarm(t)
	e := Experiment{Farm: f, Sessions: []int{4, 16}, Duration: time.Minute, Seed: 42}
	var out [2][]byte
	for i := range out {
		rep, err := Run(context.Background(), e)
		if err != nil {
			t.Fatal(err)
		}
		if out[i], err = json.Marshal(rep); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(out[0], out[1]) {
		t.Errorf("two runs with seed 42 differ:\n%s\n%s", out[0], out[1])
	}
	e.Seed = 43
	rep, err := Run(context.Background(), e)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := json.Marshal(rep)
	if bytes.Equal(other, out[0]) {
		t.Error("seeds 42 and 43 give the same output: the seed is not used")
	}
}

// TestRuleOfThumb: on the 4 x A4000 farm (about 158k KV tokens in all),
// affinity keeps a high hit rate while sessions x context (~12k each) fit
// in the farm's KV cache, and loses it beyond.
func TestRuleOfThumb(t *testing.T) {
	f := mustDefaultFarm(t)
	total := f.Spec.Replicas * f.KVTokensPerReplica()
	e, err := Experiment{Farm: f, Sessions: []int{4, 8, 32}, Duration: 2 * time.Minute, Seed: 1}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	rows, _, err := runStrategy(context.Background(), e, placement.StrategyAffinity, nil)
	if err != nil {
		t.Fatal(err)
	}
	hit := func(i int) float64 { return float64(rows[i].PrefixHitPct) }
	const context = 12500
	for i, n := range []int{4, 8} {
		if n*context >= total {
			t.Fatalf("step %d sessions no longer fits (%d >= %d): the test's premise is wrong", n, n*context, total)
		}
		if hit(i) <= hit(2)+10 {
			t.Errorf("hit %% at %d sessions (fits in KV) = %.1f, at 32 (does not) = %.1f: want a clear fall", n, hit(i), hit(2))
		}
	}
	if 32*context <= total {
		t.Fatalf("32 sessions fit in the farm's KV: the test's premise is wrong")
	}
	t.Logf("farm KV %d tokens; affinity hit %%: 4 -> %.1f, 8 -> %.1f, 32 -> %.1f", total, hit(0), hit(1), hit(2))
}

// writeTrace writes n synthetic sessions as a trace file: session k starts
// at k*gap and each turn follows the previous one by turnGap.
func writeTrace(t *testing.T, n int, gap, turnGap time.Duration) string {
	t.Helper()
	return writeWorkloadTrace(t, traces.DefaultWorkload(), n, gap, turnGap, 9, 6)
}

func traceUpperBound(t *testing.T, path string) float64 {
	t.Helper()
	rd, err := traces.Open(path, traces.ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	st, err := traces.Stats(rd)
	if err != nil {
		t.Fatal(err)
	}
	return st.ReuseUpperBoundTokenPct
}

// TestReplayBelowInfiniteCache: replaying a trace can never hit more than
// an infinite cache that sees the trace in order.
func TestReplayBelowInfiniteCache(t *testing.T) {
	path := writeTrace(t, 30, 4*time.Second, 15*time.Second)
	bound := traceUpperBound(t, path)
	tr, err := LoadTrace(path)
	if err != nil {
		t.Fatal(err)
	}
	f := mustDefaultFarm(t)
	for _, closed := range []bool{false, true} {
		for _, strategy := range placement.Strategies() {
			if closed && peerRouter(strategy) {
				continue // the peers' routers in the open loop only: the suite's time
			}
			t.Run(fmt.Sprintf("closed=%v/%s", closed, strategy), func(t *testing.T) {
				e, err := Experiment{Farm: f, Trace: tr, ClosedLoop: closed, Speed: 1}.withDefaults()
				if err != nil {
					t.Fatal(err)
				}
				rows, r, err := runStrategy(context.Background(), e, strategy, nil)
				if err != nil {
					t.Fatal(err)
				}
				checkRun(t, r, rows)
				row := rows[0]
				if row.Unfinished != 0 || row.Finished != int64(len(tr.Requests)) {
					t.Errorf("finished %d, unfinished %d of %d requests: a replay without --duration runs to the end",
						row.Finished, row.Unfinished, len(tr.Requests))
				}
				if hit := float64(row.PrefixHitPct); hit > bound+1e-9 {
					t.Errorf("hit %.3f%% exceeds the infinite-cache bound %.3f%%", hit, bound)
				}
				t.Logf("hit %.1f%% (bound %.1f%%), %s simulated", float64(row.PrefixHitPct), bound, time.Duration(row.DurationS*1e9))
			})
		}
	}
}

func TestReplayBlockSizeMismatch(t *testing.T) {
	path := writeTrace(t, 2, time.Second, time.Second)
	tr, err := LoadTrace(path)
	if err != nil {
		t.Fatal(err)
	}
	tr.Header.BlockSize = 32
	if _, err := Run(context.Background(), Experiment{Farm: mustDefaultFarm(t), Trace: tr}); err == nil {
		t.Error("a trace of another block size was accepted")
	}
}

func TestContextCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, Experiment{Farm: mustDefaultFarm(t), Sessions: []int{4}, Duration: time.Minute}); err == nil {
		t.Error("a cancelled context did not stop the run")
	}
}

func TestMain_writeText(t *testing.T) {
	rep, err := Run(context.Background(), Experiment{Farm: mustDefaultFarm(t), Sessions: []int{4}, Duration: 20 * time.Second, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b.Bytes(), []byte(" -> ")) || !bytes.Contains(b.Bytes(), []byte("prefix hit %")) {
		t.Errorf("table:\n%s", b.String())
	}
	if testing.Verbose() {
		os.Stdout.Write(b.Bytes())
	}
}

func newEvaluatorForTest() *metrics.Evaluator { return metrics.NewEvaluator() }

// TestRejectedRequests: requests longer than a replica's whole KV cache are
// rejected and reported unfinished, and the run still ends.
func TestRejectedRequests(t *testing.T) {
	f := *mustDefaultFarm(t)
	f.NumGPUBlocks = 300 // 4.8k tokens: every first turn (~10.8k) is too long
	e, err := Experiment{Farm: &f, Sessions: []int{4}, Duration: 10 * time.Second}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	rows, r, err := runStrategy(context.Background(), e, placement.StrategyAffinity, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkRun(t, r, rows)
	if rows[0].Finished != 0 || rows[0].Unfinished < 4*10 {
		t.Errorf("finished %d, unfinished %d: want every request rejected, a few per client and second",
			rows[0].Finished, rows[0].Unfinished)
	}
}
