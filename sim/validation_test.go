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
	// moves it; tighter would check the seed, not the model. The published
	// table has no repeated runs to take a spread from; the model's own
	// stated uncertainty is of the same size: the speed band a planner
	// simulates for an uncalibrated card (FarmSpec.SpeedScale 0.8-1.2)
	// moves affinity's 4-session p95 by +34 % and -16 %.
	"ttfb_p95_s": {rel: 0.35},
}

// knownGap is a cell that the simulator's mechanisms do not bring within
// tolerance: why, and how far off it was when it was listed (off, in the
// column's unit: a fraction of the published figure, or points for the
// percentage columns). It is printed, never closed by fitting, and the
// test fails when the cell drifts further off than that by more than a
// quarter of the column's tolerance (gapSlack): a gap may stay open, not
// grow unnoticed.
type knownGap struct {
	reason string
	off    float64
}

// gapSlack is how much further off than its listed figure a known gap may
// drift before the test fails: a quarter of the column's tolerance (8.75
// points of TTFB, 3.75 of output tokens, 1.25 hit points), stated here
// and not chosen from the figures.
func gapSlack(col string) float64 {
	tol := validationTolerance[col]
	return max(tol.abs, tol.rel) / 4
}

// knownGaps are the cells listed as gaps, by gapKey.
var knownGaps = map[string]knownGap{
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
	gapKey("least-loaded", 4, "prefix_hit_pct"): {off: -5.2,
		reason: "rotation over the client's pooled connections: 51 % (session/request connections: 55 %); the bench's mapping is not known"},
	// The roofline's default efficiencies (0.8 of bandwidth, 100 us per
	// step) make an A4000 decode 256 tokens faster than the published run
	// did; warden calibrate fits them from a farm's histograms, and fitting
	// them to this table is what this test forbids.
	gapKey("affinity", 4, "output_tokens_per_min"): {off: 0.174,
		reason: "decode step time: default roofline efficiencies, not calibrated on an A4000"},
	gapKey("affinity", 8, "output_tokens_per_min"): {off: 0.192,
		reason: "decode step time: default roofline efficiencies, not calibrated on an A4000"},
	// Affinity's TTFB at 8 sessions, the load carried on from the 4-session
	// step as the published run did (testdata/validation/README.md): p50
	// 0.28 s simulated against 0.48, p95 2.49 against 5.03. A 5 s TTFB is a
	// first turn that waited for another first turn's whole 7.3k-token
	// prefill on its engine: vLLM's scheduler gives the token budget (2048
	// on a card under 70 GiB: vllm/engine/arg_utils.py, the batch defaults,
	// get_batch_defaults) to the running requests first, the
	// partial prefill included, and to waiting ones only with what is left
	// (vllm/v1/core/sched/scheduler.py Scheduler.schedule, "First, schedule
	// the RUNNING requests"). For p95 a quarter of the step's first turns
	// must do so. In the model a pair of sessions on one engine is either
	// in step (their turns start within one prefill of each other: every
	// later first turn waits for the other's) or apart (more than a
	// prefill: none ever waits, since the partner decodes a token a step
	// while the prefill runs and ends its turn after it), and stays so; a
	// pair is in step only if it started together. Every pair does when a
	// step starts all its sessions at once (warden bench --fresh-steps,
	// Experiment.FreshSteps: p95 4.77 s, printed below); carried on, each
	// new session arrives while its partner decodes, and no pair does.
	// Neither sessions doubled up on an engine (hash homes them blind to
	// load: p95 2.5 s), nor forgetting ended conversations at once (the
	// same bytes), nor the slow edge of the speed band (0.8, which brings
	// output tokens per minute to the published figure: p95 3.1 s) changes
	// it (TestCarriedOnTailStaysOnePrefill). The published replicas busy
	// (2.83 at 4 sessions, 3.96 simulated) says the real sessions shared
	// engines, which the proxy's score as modelled never makes them do (an
	// idle replica has nothing in flight and the lowest score), nor the
	// real proxy in front of warden emulate with this farm (p95 2.46 s at
	// 8 carried on, 4.11 with fresh steps: testdata/validation/README.md).
	// What put the real first turns in step is not known; no constant is
	// fitted to put them there.
	gapKey("affinity", 8, "ttfb_p50_s"): {off: -0.421,
		reason: "first turns do not meet carried on (0.28 s; started together 0.39 s)"},
	gapKey("affinity", 8, "ttfb_p95_s"): {off: -0.505,
		reason: "first turns do not meet carried on (2.49 s; started together 4.77 s)"},
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
	// The published run carried the load on from step to step, sessions
	// not cut at a step's end (testdata/validation/README.md), which is
	// what is checked. Run as warden bench --fresh-steps runs its steps (each step's
	// sessions cut, the next all started at once) the TTFB is printed
	// below for comparison, not checked: it is not how the rows were
	// measured.
	sum, fresh := mean(false), mean(true)
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
			off, offText := (got-want)/want, fmt.Sprintf("%+.1f%%", 100*(got-want)/want)
			if c == "prefix_hit_pct" || c == "stayed_pct" {
				off, offText = got-want, fmt.Sprintf("%+.1f pt", got-want)
			}
			check := "-"
			if tol, checked := validationTolerance[c]; checked {
				in := (tol.abs > 0 && math.Abs(got-want) <= tol.abs) || (tol.rel > 0 && math.Abs(got-want) <= tol.rel*want)
				g, isGap := knownGaps[gapKey(p.strategy, p.sessions, c)]
				switch {
				case in && isGap:
					check = "ok (listed as a gap: remove it)"
					t.Errorf("%s/%d %s: within tolerance but listed as a known gap", p.strategy, p.sessions, c)
				case in:
					check = "ok"
				case isGap && math.Abs(off) > math.Abs(g.off)+gapSlack(c):
					check = "GAP GREW: " + g.reason
					t.Errorf("%s/%d %s: the known gap grew: off by %s, listed at %+.3g (slack %.3g)", p.strategy, p.sessions, c, offText, g.off, gapSlack(c))
				case isGap:
					check = "KNOWN GAP: " + g.reason
				default:
					check = "FAIL"
					t.Errorf("%s/%d %s: simulated %.3g, published %.3g (%s)", p.strategy, p.sessions, c, got, want, offText)
				}
			}
			fmt.Fprintf(&b, "%-14s %-3d %-22s %10.3g %10.3g %9s  %s\n", p.strategy, p.sessions, c, got, want, offText, check)
		}
	}
	// The TTFB columns again as warden bench --fresh-steps runs its steps, for comparison.
	fmt.Fprintf(&b, "\nTTFB with each step's sessions cut and the next step's started at once (warden bench and sim --fresh-steps), not checked:\n")
	fmt.Fprintf(&b, "%-14s %-3s %-22s %10s %10s %9s\n", "strategy", "n", "column", "simulated", "published", "off by")
	for _, p := range pub {
		for _, c := range []string{"ttfb_p50_s", "ttfb_p95_s"} {
			want, ok := p.cols[c]
			if !ok {
				continue
			}
			got := fresh[gapKey(p.strategy, p.sessions, c)]
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
