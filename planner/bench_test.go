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
// (4 to 32, and 39: 32 + the default 20 % headroom) of the default agent
// workload, with 30-second steps (a tenth of the product benchmark's 3
// minutes). Each of the 72 routings is a band of up to 27 runs (KV x speed
// x seeds), each run up to 3 minutes of farm time (solve.go's simulate),
// then the bisection: tens of seconds on 2 cores.
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
// x engine speed x0.8, x1, x1.2 x 3 seeds), its headroom level, the
// bisection of every candidate's capacity and the answer's timeline. It
// must stay under 10 s a run on 2 cores:
//
//	go test -run '^$' -bench BuiltInPlan -benchtime 1x -cpu 2 ./planner/
//
// Besides the time it reports the work, which does not depend on the
// machine: sim-min/op, the simulated farm time over every simulation, in
// minutes, and runs/op, the simulations.
func BenchmarkBuiltInPlan(b *testing.B) {
	p, err := ParsePlan(DefaultPlan, DefaultPlanName)
	if err != nil {
		b.Fatal(err)
	}
	var runs int
	b.ReportAllocs()
	defer measureWork(b, &p)()
	defer func() { b.ReportMetric(float64(runs), "runs/op") }()
	for b.Loop() {
		res, err := Solve(context.Background(), p)
		if err != nil {
			b.Fatal(err)
		}
		if res.Best < 0 {
			b.Fatalf("the built-in plan has no answer: %s", res.Answer)
		}
		runs = simulations(res)
	}
}

// simulations counts the simulations a result took: every band run of
// every routing of every candidate (one per level with a trace, else one
// for all levels), every run of every bisection probe, and the timeline.
func simulations(res *Result) int {
	n := 0
	perLevel := res.Workload.Spec.Trace != ""
	for _, c := range res.Candidates {
		for _, cfg := range c.Configs {
			if len(cfg.Bands) == 0 {
				continue
			}
			k := cfg.Bands[0].Runs
			if perLevel {
				k *= len(cfg.Bands)
			}
			n += k
		}
		for _, b := range c.Probes {
			n += b.Runs
		}
	}
	if res.Timeline != nil {
		n++
	}
	return n
}

// measureWork makes p's progress count the farm time simulated and
// returns what reports it per op (sim-min/op, which does not depend on the
// machine) with the CPU time (cpu-ms/op): defer its call.
func measureWork(b *testing.B, p *Plan) func() {
	var total time.Duration
	p.Progress = func(_, t time.Duration) { total = t }
	start := cpuTime()
	return func() {
		b.ReportMetric(float64((cpuTime()-start).Milliseconds())/float64(b.N), "cpu-ms/op")
		b.ReportMetric(total.Minutes(), "sim-min/op")
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

// BenchmarkSolveSharedWarmUps is a small plan of several candidates
// (sharedWarmUpPlan: three farm sizes, two routings, two levels and the
// bisection) solved with the bisection's first probe simulating every run
// from the first level (plain) and taking the sweep's runs' last step
// (shared, skip.go). sim-min/op is the farm time simulated, which does not
// depend on the machine.
func BenchmarkSolveSharedWarmUps(b *testing.B) {
	for _, tc := range []struct {
		name    string
		noAhead bool
	}{{"plain", true}, {"shared", false}} {
		b.Run(tc.name, func(b *testing.B) {
			p := sharedWarmUpPlan()
			p.noAhead = tc.noAhead
			defer measureWork(b, &p)()
			for b.Loop() {
				if _, err := Solve(context.Background(), p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// plan64GPU is issue 39's plan at the size people buy, as
//
//	warden plan --gpu "H100 SXM,L40S" --replicas 16,32,64 \
//	  --model meta-llama/Llama-3.1-8B-Instruct --sessions 64,128,256
//
// builds it: six candidates of 16 to 64 cards, the --gpu plans' defaults
// (vLLM's max_num_seqs, 1-minute steps, both routings, the band).
func plan64GPU() Plan {
	return Plan{
		Farms: []FarmSet{{
			GPUs:     []string{"H100 SXM", "L40S"},
			Replicas: []int{16, 32, 64},
			Model:    "meta-llama/Llama-3.1-8B-Instruct",
		}},
		Sessions:        []int{64, 128, 256},
		Headroom:        HeadroomOf(0.2),
		Duration:        sim.Duration(time.Minute),
		Seed:            1,
		Strategies:      []string{"least-loaded", "affinity"},
		SpillThresholds: []string{"auto"},
		Targets:         Targets{TTFBP95MaxS: 10, PrefixHitPctMin: 75},
	}
}

// BenchmarkPlan64GPU solves plan64GPU (issue 39: under 60 s on 2 cores):
//
//	go test -run '^$' -bench Plan64GPU -benchtime 1x -cpu 2 ./planner/
//
// The 16-card tier answers it, so the 32- and 64-card candidates are not
// simulated (tiers.go); /every is the same plan with every candidate
// simulated. sim-min/op is the farm time simulated, which does not depend
// on the machine.
func BenchmarkPlan64GPU(b *testing.B) {
	for _, every := range []bool{false, true} {
		name := map[bool]string{false: "tiers", true: "every"}[every]
		b.Run(name, func(b *testing.B) {
			p := plan64GPU()
			p.EveryCandidate = every
			b.ReportAllocs()
			defer measureWork(b, &p)()
			for b.Loop() {
				res, err := Solve(context.Background(), p)
				if err != nil {
					b.Fatal(err)
				}
				if res.Best < 0 {
					b.Fatalf("no answer: %s", res.Answer)
				}
			}
		})
	}
}
