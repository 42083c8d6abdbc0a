package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb/chunkenc"

	"github.com/lm-warden/warden/metrics"
	"github.com/lm-warden/warden/metrics/names"
	"github.com/lm-warden/warden/traces"
)

var equivDump = flag.String("equiv-dump", "", "write each equivalence workload's full output (report, request records, every series) to this directory")

// equivCase is one workload of the equivalence test.
type equivCase struct {
	name string
	e    func(t testing.TB) Experiment
}

// equivCases are the workloads on which the fast path must give exactly
// the output of the step-by-step model: several farms, replay and closed
// loop, steps up and down, overload and queues, preemption (vLLM before
// scheduler_reserve_full_isl), every lookup counted (before 0.24), prefix
// sharing, subagents, all strategies and both least-loaded balancers.
func equivCases() []equivCase {
	issue16 := func(blocks, n int, edit func(*FarmSpec)) func(testing.TB) Experiment {
		return func(t testing.TB) Experiment {
			f, err := ParseFarmWith([]byte(issue16FarmYAML(blocks)), "issue16.yaml", edit)
			if err != nil {
				t.Fatal(err)
			}
			return Experiment{Farm: f, Strategies: []string{"least-loaded", "affinity"}, Trace: issue16TraceN(t, 1, n), Seed: 1}
		}
	}
	closed := func(farm func(testing.TB) *Farm, w func() traces.Workload, sessions []int, d time.Duration, strategies ...string) func(testing.TB) Experiment {
		return func(t testing.TB) Experiment {
			e := Experiment{Farm: farm(t), Sessions: sessions, Duration: d, Seed: 3, Strategies: strategies}
			if w != nil {
				e.Workload = w()
			}
			return e
		}
	}
	tight := func(edit func(*Farm)) func(testing.TB) *Farm {
		return func(t testing.TB) *Farm {
			f := *mustDefaultFarm(t)
			f.NumGPUBlocks = 3000
			f.Spec.VLLM.MaxNumBatchedTokens = 512
			edit(&f)
			return &f
		}
	}
	sub := func() traces.Workload {
		w := traces.DefaultWorkload()
		w.SubagentProbability = 0.3
		w.ThinkTime = 2 * time.Second
		return w
	}
	return []equivCase{
		{"issue16-a", issue16(1500, 3000, nil)},
		{"issue16-b-overload", issue16(300, 3000, nil)},
		{"issue16-preempt", issue16(300, 2000, func(s *FarmSpec) { s.VLLM.ReserveFullISL = "false" })},
		{"issue16-warden-balancer", issue16(800, 2000, func(s *FarmSpec) { s.Routing.Balancer = BalancerWarden })},
		{"a4000-steps", closed(mustDefaultFarm, nil, []int{4, 16, 8, 24}, 40*time.Second, "hash", "least-loaded", "affinity")},
		{"a4000-preempt", closed(tight(func(f *Farm) { f.Spec.VLLM.ReserveFullISL = "false" }), nil, []int{8, 16}, 60*time.Second, "least-loaded", "affinity")},
		{"a4000-every-lookup", closed(tight(func(f *Farm) { f.Behaviour.StatsAtAdmission = false }), nil, []int{16}, 60*time.Second, "affinity")},
		{"h100-70b-subagents", closed(func(t testing.TB) *Farm { return mustExampleFarm(t, "h100-llama31-70b-tp4.yaml") }, sub, []int{8, 32}, 30*time.Second)},
		{"rtx5090-58k", closed(func(t testing.TB) *Farm { return mustExampleFarm(t, "rtx5090-gemma3-27b-int4.yaml") }, Workload58k, []int{26}, 90*time.Second, "affinity")},
		// Issue 48's shapes: pauses, compaction, subagents side by side.
		{"rtx5090-preset", closed(func(t testing.TB) *Farm { return mustExampleFarm(t, "rtx5090-gemma3-27b-int4.yaml") }, presetWorkload("5090-farm"), []int{26}, 5*time.Minute, "hash", "affinity")},
		{"h100-claude-code", closed(func(t testing.TB) *Farm { return mustExampleFarm(t, "h100-llama31-70b-tp4.yaml") }, presetWorkload("claude-code"), []int{16}, 5*time.Minute, "least-loaded", "affinity")},
	}
}

// runEquiv runs e and returns everything it outputs: the report as JSON,
// the request records and every series of every strategy's store.
func runEquiv(t testing.TB, e Experiment) string {
	t.Helper()
	var reqs bytes.Buffer
	var mu sync.Mutex
	stores := map[string]string{}
	e.Requests = &reqs
	e.OnStore = func(s string, st *metrics.Store) {
		d := dumpStore(t, st)
		mu.Lock()
		stores[s] = d
		mu.Unlock()
	}
	rep, err := Run(context.Background(), e)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	js, err := json.MarshalIndent(rep, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	out.Write(js)
	out.WriteString("\n# requests\n")
	out.Write(reqs.Bytes())
	names := make([]string, 0, len(stores))
	for s := range stores {
		names = append(names, s)
	}
	sort.Strings(names)
	for _, s := range names {
		fmt.Fprintf(&out, "# store %s\n%s", s, stores[s])
	}
	return out.String()
}

// dumpStore writes every sample of every series of st, in label order.
func dumpStore(t testing.TB, st *metrics.Store) string {
	q, err := st.Querier(math.MinInt64, math.MaxInt64)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	ss := q.Select(context.Background(), true, nil, labels.MustNewMatcher(labels.MatchRegexp, labels.MetricName, ".+"))
	var b strings.Builder
	for ss.Next() {
		s := ss.At()
		b.WriteString(s.Labels().String())
		it := s.Iterator(nil)
		for vt := it.Next(); vt != chunkenc.ValNone; vt = it.Next() {
			if vt == chunkenc.ValFloat {
				tm, v := it.At()
				fmt.Fprintf(&b, " %d:%v", tm, v)
			} else {
				tm, h := it.AtFloatHistogram(nil)
				fmt.Fprintf(&b, " %d:%s", tm, h.String())
			}
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// TestDumpEquivWorkloads writes the output of every equivalence workload
// with -equiv-dump, to compare two versions of the model byte for byte.
func TestDumpEquivWorkloads(t *testing.T) {
	if *equivDump == "" {
		t.Skip("no -equiv-dump directory")
	}
	if err := os.MkdirAll(*equivDump, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range equivCases() {
		out := runEquiv(t, c.e(t))
		if err := os.WriteFile(filepath.Join(*equivDump, c.name+".txt"), []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFastPathEquivalence runs every equivalence workload with the fast
// paths of pure decode work and step by step (stepByStep), and compares
// everything they output: the report, the request records and every
// sample of every series.
func TestFastPathEquivalence(t *testing.T) {
	for _, c := range equivCases() {
		t.Run(c.name, func(t *testing.T) {
			e := c.e(t)
			fast := runEquiv(t, e)
			stepByStep = true
			slow := runEquiv(t, e)
			stepByStep = false
			if fast != slow {
				a, b := strings.Split(fast, "\n"), strings.Split(slow, "\n")
				for i := range min(len(a), len(b)) {
					if a[i] != b[i] {
						t.Fatalf("line %d differs:\nfast:         %.300s\nstep by step: %.300s", i+1, a[i], b[i])
					}
				}
				t.Fatalf("outputs differ in length: %d and %d lines", len(a), len(b))
			}
		})
	}
}

// TestLeanRunsAgree runs every equivalence workload with a full recorder
// (OnStore set: every series at every scrape) and with a lean one (no
// OnStore: the series of rowKPIs only), and compares the reports and the
// request records; and checks that the lean store holds the series the
// rowKPIs read, and no others.
func TestLeanRunsAgree(t *testing.T) {
	for _, c := range equivCases() {
		t.Run(c.name, func(t *testing.T) {
			e := c.e(t)
			run := func(onStore func(string, *metrics.Store)) string {
				var reqs bytes.Buffer
				e.Requests, e.OnStore = &reqs, onStore
				rep, err := Run(context.Background(), e)
				if err != nil {
					t.Fatal(err)
				}
				js, err := json.MarshalIndent(rep, "", " ")
				if err != nil {
					t.Fatal(err)
				}
				return string(js) + "\n" + reqs.String()
			}
			full, lean := run(func(string, *metrics.Store) {}), run(nil)
			if full != lean {
				a, b := strings.Split(full, "\n"), strings.Split(lean, "\n")
				for i := range min(len(a), len(b)) {
					if a[i] != b[i] {
						t.Fatalf("line %d differs:\nfull: %.300s\nlean: %.300s", i+1, a[i], b[i])
					}
				}
				t.Fatalf("outputs differ in length: %d and %d lines", len(a), len(b))
			}
		})
	}
	e := equivCases()[0].e(t)
	e, err := e.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	e.lean = true
	_, r, err := runStrategy(context.Background(), e, e.Strategies[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, s := range strings.Split(dumpStore(t, r.rec.store), "\n") {
		if name, _, ok := strings.Cut(strings.TrimPrefix(s, `{__name__="`), `"`); ok {
			seen[name] = true
		}
	}
	want := []string{names.VLLMPrefixCacheQueries, names.VLLMPrefixCacheHits, names.WardenInFlight,
		names.WardenOutputTokens, names.WardenSessionsCompleted, names.WardenLaterTurns, names.WardenLaterTurnsHome}
	for _, n := range want {
		if !seen[n] {
			t.Errorf("the lean store has no %s", n)
		}
		delete(seen, n)
	}
	for n := range seen {
		if !strings.HasPrefix(n, names.WardenTTFB) {
			t.Errorf("the lean store holds %s, which no row KPI reads", n)
		}
	}
}

// presetWorkload returns a function giving the named preset.
func presetWorkload(name string) func() traces.Workload {
	return func() traces.Workload {
		w, err := traces.Preset(name)
		if err != nil {
			panic(err)
		}
		return w
	}
}
