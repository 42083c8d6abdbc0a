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
