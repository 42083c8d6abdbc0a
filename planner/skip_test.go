package planner

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/lm-warden/warden/internal/racetest"
	"github.com/lm-warden/warden/sim"
)

// sharedWarmUpPlan is kvBoundPlan (9 runs a band: speed x seeds) with
// shorter steps, where 3 and 4 replicas still meet at the highest level:
// their bisection's first probe is at the cap (18 sessions), after both
// levels; 2 replicas miss at 12.
func sharedWarmUpPlan() Plan {
	p := kvBoundPlan()
	p.Duration = sim.Duration(15 * time.Second)
	return p
}

// solveJSON solves p and returns its result and JSON, less Skipped.
func solveJSON(t *testing.T, p Plan) (*Result, []byte) {
	t.Helper()
	res, err := Solve(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	c := *res
	c.Skipped = nil
	data, err := json.MarshalIndent(&c, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return res, data
}

// TestSolveSharedWarmUpsExact: the bisection's first probe taking the
// last step of the sweep's band runs (which went on to the cap) gives the
// result, byte for byte, that simulating every probe run from the first
// level gives; and it did happen.
func TestSolveSharedWarmUpsExact(t *testing.T) {
	racetest.SimulationOnly(t)
	p := sharedWarmUpPlan()
	p.noAhead = true
	plain, want := solveJSON(t, p)
	p.noAhead = false
	shared, got := solveJSON(t, p)
	if !bytes.Equal(got, want) {
		t.Errorf("with shared warm-ups the result differs from the one without:\n%s", firstDiff(got, want))
	}
	if s := plain.Skipped; s.SharedWarmUps != 0 || s.AheadUnused != 0 {
		t.Errorf("without shared warm-ups: %+v, want none shared nor run ahead", *s)
	}
	s := shared.Skipped
	// The work is counted: every run of a probe at the cap (the first
	// probe, after every level) but the nominal one was taken from the
	// sweep, sparing the levels before it; the band holds those it used
	// (all of them, or the first stage's when that missed).
	probes, wantShared := 0, 0
	for _, c := range shared.Candidates {
		for _, b := range c.Probes {
			if b.Sessions == capLevel(shared.Sessions) {
				probes++
				wantShared += (b.Runs - 1) * len(shared.Sessions)
			}
		}
	}
	if probes < 2 || s.SharedWarmUps != wantShared {
		t.Errorf("%d probes at the cap, want 2 or more; shared warm-up steps %d, want %d", probes, s.SharedWarmUps, wantShared)
	}
	// The steps: each warm-up shared was simulated once fewer, each step
	// run ahead for nothing once more.
	if d := plain.Skipped.Steps - s.Steps; d != s.SharedWarmUps-s.AheadUnused {
		t.Errorf("steps %d without, %d with: %d fewer, want %d (%d warm-up steps shared, %d run ahead unused)",
			plain.Skipped.Steps, s.Steps, d, s.SharedWarmUps-s.AheadUnused, s.SharedWarmUps, s.AheadUnused)
	}
	if s.NominalOnly != plain.Skipped.NominalOnly || s.FirstStage != plain.Skipped.FirstStage {
		t.Errorf("nominal only %d, first stage %d; without shared warm-ups %d, %d: want the same",
			s.NominalOnly, s.FirstStage, plain.Skipped.NominalOnly, plain.Skipped.FirstStage)
	}
}

// TestSolveDeterministicInParallel: the result, its skip counts included,
// does not depend on how many simulations run at once; by cost, cheapest
// first, as a plan runs by default (tiers.go), 4 x H100 left out.
func TestSolveDeterministicInParallel(t *testing.T) {
	p := sharedWarmUpPlan()
	p.EveryCandidate = false
	var out [][]byte
	for _, par := range []int{1, 4, 4} {
		p.Parallelism = par
		res, err := Solve(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		data, err := json.Marshal(res)
		if err != nil {
			t.Fatal(err)
		}
		if res.Skipped.Candidates != 1 {
			t.Fatalf("parallelism %d: %d candidates left out, want 1 (4 x H100)", par, res.Skipped.Candidates)
		}
		out = append(out, data)
	}
	for i := 1; i < len(out); i++ {
		if !bytes.Equal(out[i], out[0]) {
			t.Errorf("run %d differs from the first:\n%s", i, firstDiff(out[i], out[0]))
		}
	}
}

// TestSkippedJSON: the counts are the result's "skipped" object, last,
// and read back.
func TestSkippedJSON(t *testing.T) {
	res := &Result{Kind: Kind, Best: -1, Closest: -1, Skipped: &Skipped{Steps: 725, NominalOnly: 494, FirstStage: 161, SharedWarmUps: 104, AheadUnused: 26}}
	data, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	const tail = `,"skipped":{"steps":725,"nominal_only":494,"first_stage":161,"shared_warm_ups":104,"ahead_unused":26}}`
	if !bytes.HasSuffix(data, []byte(tail)) {
		t.Errorf("JSON %s\nwant it to end with %s", data, tail)
	}
	back, err := ReadResult(data)
	if err != nil {
		t.Fatal(err)
	}
	if *back.Skipped != *res.Skipped {
		t.Errorf("read back %+v, want %+v", *back.Skipped, *res.Skipped)
	}
	res.Skipped = nil
	if data, _ := json.Marshal(res); bytes.Contains(data, []byte("skipped")) {
		t.Errorf("a result without the counts: %s, want no skipped key", data)
	}
}

func TestSkipNote(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    *Skipped
		want string
	}{
		{"none counted", nil, ""},
		{"all", &Skipped{Steps: 1234, NominalOnly: 494, FirstStage: 161, SharedWarmUps: 104, AheadUnused: 26},
			"Not simulated, as they could not change the answer: 494 steps of band runs at levels the nominal run already misses " +
				"and 161 steps of probes whose first stage (the nominal run and the pessimistic corner) already missed. " +
				"Not simulated twice: 104 steps of warm-up (the bisection's first probe took the last step of the sweep's band runs, " +
				"which went on to its level; 26 steps run on that way went unused). Simulated: 1,234 steps of 1m0s."},
		{"shared, all used", &Skipped{Steps: 12, SharedWarmUps: 1},
			"Not simulated twice: 1 step of warm-up (the bisection's first probe took the last step of the sweep's band runs, " +
				"which went on to its level). Simulated: 12 steps of 1m0s."},
		{"run ahead for nothing", &Skipped{Steps: 1, AheadUnused: 1},
			"1 step run on to the bisection's first probe went unused. Simulated: 1 step of 1m0s."},
		{"nothing left out", &Skipped{Steps: 1000000},
			"Simulated: 1,000,000 steps of 1m0s."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := &Result{DurationS: 60, Skipped: tc.s}
			if got := res.SkipNote(); got != tc.want {
				t.Errorf("SkipNote()\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}

// firstDiff shows where two texts part.
func firstDiff(a, b []byte) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	lo := max(i-200, 0)
	return "got:  ..." + string(a[lo:min(i+200, len(a))]) + "\nwant: ..." + string(b[lo:min(i+200, len(b))])
}
