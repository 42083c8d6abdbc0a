package sim

import (
	"context"
	"testing"
	"time"

	"github.com/lm-warden/warden/traces"
)

// TestPairedFirstTurnsQueue is the TTFB tail's mechanism on one engine:
// two sessions that start together stay in step, and each time their
// first turns arrive together the second waits for the first's whole
// prefill (the running partial prefill is served first), so its TTFB is
// about twice the first's; carried on from a one-session step, the second
// session starts at another phase and its first turns do not wait.
func TestPairedFirstTurnsQueue(t *testing.T) {
	farm, err := LoadFarm("testdata/validation/farm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	farm.Spec.Replicas = 1
	farm, err = Resolve(farm.Spec)
	if err != nil {
		t.Fatal(err)
	}
	w, err := traces.LoadWorkload("testdata/validation/workload.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p95 := func(fresh bool) float64 {
		rep, err := Run(context.Background(), Experiment{Farm: farm, Workload: w, Sessions: []int{1, 2}, Duration: 3 * time.Minute,
			Strategies: []string{"affinity"}, Seed: 1, FreshSteps: fresh})
		if err != nil {
			t.Fatal(err)
		}
		return float64(rep.Rows[1].TTFBP95)
	}
	alone := p95(false) // p95 of the 1-session step would do as well; the 2-session one carried on
	paired := p95(true)
	if paired < 1.6*alone || paired > 2.4*alone {
		t.Errorf("2 sessions on one engine: TTFB p95 %.2f s started together, %.2f s carried on; want about twice (a first turn waits for the other's prefill)", paired, alone)
	}
	t.Logf("TTFB p95 at 2 sessions on one A4000: %.2f s carried on, %.2f s started together", alone, paired)
}

// TestCarriedOnTailStaysOnePrefill pins what the known gap of
// TestValidationAgainstPublished says of affinity's 8-session TTFB tail on
// the published farm, the load carried on from the 4-session step: its p95
// stays one first-turn prefill (within 1.3 x the 4-session p95) whether
// the sessions share engines (hash homes them blind to load: 2.5 of 4
// replicas busy at 4 sessions, as published for affinity) or the engines
// run at the slow edge of the uncalibrated speed band (0.8, which also
// brings output tokens per minute to the published figure); only sessions
// started together (FreshSteps) make first turns wait for another's
// prefill, p95 about twice the 4-session one. If a change of the model
// makes one of the carried-on cases reach the published 5 s, the gap's
// note must be revisited.
func TestCarriedOnTailStaysOnePrefill(t *testing.T) {
	w, err := traces.LoadWorkload("testdata/validation/workload.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		strategy string
		speed    float64
		fresh    bool
		lo, hi   float64 // p95 at 8 sessions over p95 at 4
	}{
		{"affinity", "affinity", 1, false, 0.7, 1.3},
		{"hash, sessions doubled up", "hash", 1, false, 0.7, 1.3},
		{"affinity, speed 0.8", "affinity", 0.8, false, 0.7, 1.3},
		{"affinity, steps started afresh", "affinity", 1, true, 1.6, 2.4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			farm, err := LoadFarm("testdata/validation/farm.yaml")
			if err != nil {
				t.Fatal(err)
			}
			farm.Spec.SpeedScale = tc.speed
			if farm, err = Resolve(farm.Spec); err != nil {
				t.Fatal(err)
			}
			rep, err := Run(context.Background(), Experiment{Farm: farm, Workload: w, Sessions: []int{4, 8}, Duration: 3 * time.Minute,
				Strategies: []string{tc.strategy}, Seed: 1, FreshSteps: tc.fresh})
			if err != nil {
				t.Fatal(err)
			}
			p4, p8 := float64(rep.Rows[0].TTFBP95), float64(rep.Rows[1].TTFBP95)
			if r := p8 / p4; r < tc.lo || r > tc.hi {
				t.Errorf("TTFB p95 %.2f s at 8 sessions, %.2f s at 4: ratio %.2f, want %.1f-%.1f", p8, p4, r, tc.lo, tc.hi)
			}
			t.Logf("TTFB p95 %.2f s at 4 sessions, %.2f s at 8 (replicas busy %.2f, %.2f)", p4, p8, float64(rep.Rows[0].ReplicasBusy), float64(rep.Rows[1].ReplicasBusy))
		})
	}
}
