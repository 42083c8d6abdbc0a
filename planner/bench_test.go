package planner

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/lm-warden/warden/sim"
)

// BenchmarkSolve24x3x5 is the sweep: 24 candidate farms (six GPU
// kinds x 1 to 4 replicas of Qwen3-4B) x 3 strategies x 5 sessions levels
// (4 to 32) of the default agent workload, with 30-second steps (a tenth
// of the product benchmark's 3 minutes) so that it runs in seconds.
// 72 simulations of 2.5 minutes of farm time each.
func BenchmarkSolve24x3x5(b *testing.B) {
	p := Plan{
		Farms: []FarmSet{{
			GPUs:     []string{"RTX A4000", "RTX 4090", "RTX 5090", "L40S", "A100 80GB", "H100 SXM"},
			Replicas: []int{1, 2, 3, 4},
			Model:    "Qwen/Qwen3-4B-Instruct-2507",
			VLLM:     sim.VLLMSpec{MaxNumSeqs: 32},
		}},
		Strategies: []string{"hash", "least-loaded", "affinity"},
		Sessions:   []int{4, 8, 16, 24, 32},
		Duration:   sim.Duration(30 * time.Second),
		Seed:       1,
		Targets:    Targets{TTFBP95MaxS: 10, PrefixHitPctMin: 75},
	}
	b.ReportAllocs()
	for b.Loop() {
		res, err := Solve(context.Background(), p)
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Candidates) != 24 {
			b.Fatalf("%d candidates, want 24", len(res.Candidates))
		}
	}
}

// BenchmarkBuiltInPlan is the README's first command, `warden plan`: the
// built-in plan (examples/default.yaml) with its band (KV x0.85, x1, x1.10
// x 3 seeds), the bisection of every candidate's capacity and the answer's
// timeline. It must stay under 10 s a run on 2 cores:
//
//	go test -run '^$' -bench BuiltInPlan -benchtime 1x -cpu 2 ./planner/
func BenchmarkBuiltInPlan(b *testing.B) {
	p, err := ParsePlan(DefaultPlan, DefaultPlanName)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	start := cpuTime()
	defer func() {
		b.ReportMetric(float64((cpuTime()-start).Milliseconds())/float64(b.N), "cpu-ms/op")
	}()
	for b.Loop() {
		res, err := Solve(context.Background(), p)
		if err != nil {
			b.Fatal(err)
		}
		if res.Best < 0 {
			b.Fatalf("the built-in plan has no answer: %s", res.Answer)
		}
	}
}

// cpuTime is the process's CPU time, user and system: on a shared machine
// it varies much less than wall time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
