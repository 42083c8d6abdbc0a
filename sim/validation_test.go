package sim

import (
	"context"
	"encoding/csv"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/traces"
)

var validateSeeds = flag.Int("validate-seeds", 3, "seeds averaged by TestValidationAgainstPublished")

// publishedRow is one row of testdata/validation/published-*.csv: LM
// Warden's published benchmark, 4 x RTX A4000, 4 October 2026.
type publishedRow struct {
	strategy string
	sessions int
	cols     map[string]float64 // by column name; absent when the cell is empty
}

// readCSV reads every record of the CSV file at path, header first.
func readCSV(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return recs
}

func readPublished(t *testing.T, path string) []publishedRow {
	t.Helper()
	recs := readCSV(t, path)
	var err error
	head := recs[0]
	var rows []publishedRow
	for li, rec := range recs[1:] {
		row := publishedRow{strategy: rec[0], cols: map[string]float64{}}
		if row.sessions, err = strconv.Atoi(rec[1]); err != nil {
			t.Fatalf("%s:%d: sessions: %v", path, li+2, err)
		}
		for i := 2; i < len(rec); i++ {
			if rec[i] == "" {
				continue
			}
			v, err := strconv.ParseFloat(rec[i], 64)
			if err != nil {
				t.Fatalf("%s:%d: %s: %v", path, li+2, head[i], err)
			}
			row.cols[head[i]] = v
		}
		rows = append(rows, row)
	}
	return rows
}

// validationTolerance is how far a simulated cell may drift from the
// published one, for the columns that are checked.
var validationTolerance = map[string]struct {
	abs, rel float64 // points, or a fraction of the published figure
}{
	"prefix_hit_pct":        {abs: 5},
	"ttfb_p50_s":            {rel: 0.35},
	"output_tokens_per_min": {rel: 0.15},
	// TTFB p95, the figure every verdict is gated on, with the tolerance of
	// p50, stated before the comparison: a step of 3 minutes holds 100-150
	// requests, so p95 is one of the 5-8 slowest and a single request
	// moves it; tighter would check the seed, not the model.
	"ttfb_p95_s": {rel: 0.35},
}

// knownGaps are cells that the simulator's mechanisms do not bring within
// tolerance, with the reason. They are printed, never closed by fitting.
var knownGaps = map[string]string{
	// vLLM's own balancer used to be a gap here (81-83 % hits simulated,
	// 56 and 44 % published): the model published the engines' counts to
	// the API servers, which sent a session's next turn back to its
	// engine. vLLM 0.26 publishes none for a dense model (vllm.go,
	// DPBlindRotating: PR #30739, fixed by #49204 after the release), so
	// each API server rotates blind to load and caches, and the rows came
	// within tolerance from that mechanism alone, but one: at 4 sessions
	// the pool of keep-alive connections the workload names gives 51.0 %
	// (49.8 over 10 seeds), 5.2 points under the published 56.2; a new
	// connection per request gives 55.0 and one per session 54.7, inside.
	// How the published bench's connections reached vLLM's API servers
	// is not known, and the connection model is not chosen to fit a row.
	gapKey("least-loaded", 4, "prefix_hit_pct"): "rotation over the client's pooled connections: 51 % (session/request connections: 55 %); the bench's mapping is not known",
	// The roofline's default efficiencies (0.8 of bandwidth, 100 us per
	// step) make an A4000 decode 256 tokens faster than the published run
	// did; warden calibrate fits them from a farm's histograms, and fitting
	// them to this table is what this test forbids.
	gapKey("affinity", 4, "output_tokens_per_min"): "decode step time: default roofline efficiencies, not calibrated on an A4000",
	gapKey("affinity", 8, "output_tokens_per_min"): "decode step time: default roofline efficiencies, not calibrated on an A4000",
	// The TTFB tail at 8 sessions was a gap here (affinity's p95 2.49 s
	// simulated, 5.03 published; p50 0.28 and 0.48), as long as the steps
	// carried the load on. Its mechanism: a first turn that reaches an
	// engine while another session's first turn is prefilling waits for
	// that whole 7.3k-token prefill (vLLM's scheduler serves the running
	// queue, the partial prefill first, before any waiting request:
	// vllm/v1/core/sched/scheduler.py Scheduler.schedule), and two
	// sessions that start together on one engine stay in step (the same
	// turns on the same engine), so every first turn of one of them waits
	// for the other's. Affinity homes 8 sessions two to an engine; the
	// product's bench client starts each step's sessions together, after
	// cutting the previous step's (bench/bench.go, runner.step), so every
	// pair starts in step. Carried on, the 4 new sessions of the second step
	// paired with old ones at unrelated phases and no first turn collided.
	// Run as the bench runs its steps (Experiment.FreshSteps), p95 4.77 s
	// and p50 0.39 s come within tolerance, and least-loaded's 8-session
	// TTFB with them (p50 +18 % -> -2 %, p95 +20 % -> -6 %); nothing fitted.
}

func gapKey(strategy string, sessions int, col string) string {
	return fmt.Sprintf("%s/%d/%s", strategy, sessions, col)
}

// TestValidationAgainstPublished simulates the published benchmark's setup
// (testdata/validation: farm, workload, 3-minute steps of 4 then 8
// sessions, vLLM's own balancer then affinity), averaged over seeds, and
// compares every column with the published rows. `make validate` runs it
// verbosely: the side-by-side table is its log.
func TestValidationAgainstPublished(t *testing.T) {
	dir := filepath.Join("testdata", "validation")
	pub := readPublished(t, filepath.Join(dir, "published-4xa4000-rows-4-8.csv"))
	farm, err := LoadFarm(filepath.Join(dir, "farm.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := traces.LoadWorkload(filepath.Join(dir, "workload.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cols := []string{"sessions_per_hour", "output_tokens_per_min", "ttfb_p50_s", "ttfb_p95_s", "replicas_busy", "prefix_hit_pct", "stayed_pct"}
	n := max(*validateSeeds, 1)
	mean := func(fresh bool) map[string]float64 {
		sum := map[string]float64{}
		for seed := 1; seed <= n; seed++ {
			rep, err := Run(context.Background(), Experiment{Farm: farm, Workload: w, Sessions: []int{4, 8}, Duration: 3 * time.Minute,
				Seed: uint64(seed), FreshSteps: fresh})
			if err != nil {
				t.Fatal(err)
			}
			for _, row := range rep.Rows {
				for _, c := range cols {
					sum[gapKey(row.Strategy, row.Sessions, c)] += rowColumn(row, c) / float64(n)
				}
			}
		}
		return sum
	}
	// The published run's steps are those of the product's bench client
	// (bench/bench.go): each step's end cuts the requests in flight and the
	// next starts its sessions afresh, all at once. The mechanism of the
	// TTFB tail rides on it (knownGaps' note); the carried-on protocol is
	// printed below for comparison.
	sum, carried := mean(true), mean(false)
	var b strings.Builder
	fmt.Fprintf(&b, "simulated (mean of %d seeds) vs published, %s\n", n, farm.Name())
	fmt.Fprintf(&b, "%-14s %-3s %-22s %10s %10s %9s  %s\n", "strategy", "n", "column", "simulated", "published", "off by", "check")
	for _, p := range pub {
		for _, c := range cols {
			want, ok := p.cols[c]
			if !ok {
				continue
			}
			got := sum[gapKey(p.strategy, p.sessions, c)]
			off := fmt.Sprintf("%+.1f%%", 100*(got-want)/want)
			if c == "prefix_hit_pct" || c == "stayed_pct" {
				off = fmt.Sprintf("%+.1f pt", got-want)
			}
			check := "-"
			if tol, checked := validationTolerance[c]; checked {
				in := (tol.abs > 0 && math.Abs(got-want) <= tol.abs) || (tol.rel > 0 && math.Abs(got-want) <= tol.rel*want)
				reason, gap := knownGaps[gapKey(p.strategy, p.sessions, c)]
				switch {
				case in && gap:
					check = "ok (listed as a gap: remove it)"
					t.Errorf("%s/%d %s: within tolerance but listed as a known gap", p.strategy, p.sessions, c)
				case in:
					check = "ok"
				case gap:
					check = "KNOWN GAP: " + reason
				default:
					check = "FAIL"
					t.Errorf("%s/%d %s: simulated %.3g, published %.3g (%s)", p.strategy, p.sessions, c, got, want, off)
				}
			}
			fmt.Fprintf(&b, "%-14s %-3d %-22s %10.3g %10.3g %9s  %s\n", p.strategy, p.sessions, c, got, want, off, check)
		}
	}
	// The TTFB columns again with the load carried on from step to step.
	fmt.Fprintf(&b, "\nTTFB with the load carried on from step to step (no session cut, 4 new ones at the 8-session step):\n")
	fmt.Fprintf(&b, "%-14s %-3s %-22s %10s %10s %9s\n", "strategy", "n", "column", "simulated", "published", "off by")
	for _, p := range pub {
		for _, c := range []string{"ttfb_p50_s", "ttfb_p95_s"} {
			want, ok := p.cols[c]
			if !ok {
				continue
			}
			got := carried[gapKey(p.strategy, p.sessions, c)]
			fmt.Fprintf(&b, "%-14s %-3d %-22s %10.3g %10.3g %8.1f%%\n", p.strategy, p.sessions, c, got, want, 100*(got-want)/want)
		}
	}
	t.Log("\n" + b.String())
}

// rowColumn is one headline column of a row, by its JSON name.
func rowColumn(r Row, col string) float64 {
	switch col {
	case "sessions_per_hour":
		return float64(r.SessionsPerHour)
	case "output_tokens_per_min":
		return float64(r.OutputTokensPerMin)
	case "ttfb_p50_s":
		return float64(r.TTFBP50)
	case "ttfb_p95_s":
		return float64(r.TTFBP95)
	case "replicas_busy":
		return float64(r.ReplicasBusy)
	case "prefix_hit_pct":
		return float64(r.PrefixHitPct)
	case "stayed_pct":
		return float64(r.StayedPct)
	}
	panic("unknown column " + col)
}
