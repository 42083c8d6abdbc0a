package sim

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/traces"
)

// benchExperiment runs e b.N times and reports simulated seconds per wall
// second and heap allocations per request.
func benchExperiment(b *testing.B, e Experiment) {
	b.ReportAllocs()
	var requests int64
	var simulated time.Duration
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	for b.Loop() {
		rep, err := Run(context.Background(), e)
		if err != nil {
			b.Fatal(err)
		}
		for _, r := range rep.Rows {
			requests += r.Finished + r.Unfinished
			simulated += time.Duration(float64(r.DurationS) * float64(time.Second))
		}
	}
	wall := time.Since(start)
	runtime.ReadMemStats(&after)
	b.ReportMetric(simulated.Seconds()/wall.Seconds(), "sim-s/wall-s")
	if requests > 0 {
		b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(requests), "allocs/request")
		b.ReportMetric(float64(requests)/float64(b.N), "requests/op")
	}
}

// BenchmarkDefaultExperiment is `warden sim` with no flags: 5 steps of
// 3 minutes, least-loaded then affinity, on the 4 x A4000 farm.
func BenchmarkDefaultExperiment(b *testing.B) {
	benchExperiment(b, Experiment{Farm: mustDefaultFarm(b), Seed: 1})
}

// Workload58k is agent sessions of about 58k tokens at their last turn:
// 3.5k system prompt, a 40k first message, then five turns adding 2.8k new
// tokens and an answer each (3.5k + 40k + 5 x ~2.95k = ~58k).
func Workload58k() traces.Workload {
	w := traces.DefaultWorkload()
	w.FirstMessageTokens = 40000
	w.NewTokensPerTurn = 2800
	return w
}

// BenchmarkRTX5090Hour is one simulated hour of the 7 x RTX 5090 farm
// with 26 concurrent sessions of ~58k tokens, affinity routing.
func BenchmarkRTX5090Hour(b *testing.B) {
	benchExperiment(b, Experiment{
		Farm:       mustExampleFarm(b, "rtx5090-gemma3-27b-int4.yaml"),
		Workload:   Workload58k(),
		Strategies: []string{placement.StrategyAffinity},
		Sessions:   []int{26},
		Duration:   time.Hour,
		Seed:       1,
	})
}

// BenchmarkRTX5090PresetHour is one simulated hour of the same farm under
// the 5090-farm preset (issue 48): 26 sessions of distributions (tool and
// person pauses, compaction), affinity routing.
func BenchmarkRTX5090PresetHour(b *testing.B) {
	w, err := traces.Preset("5090-farm")
	if err != nil {
		b.Fatal(err)
	}
	benchExperiment(b, Experiment{
		Farm:       mustExampleFarm(b, "rtx5090-gemma3-27b-int4.yaml"),
		Workload:   w,
		Strategies: []string{placement.StrategyAffinity},
		Sessions:   []int{26},
		Duration:   time.Hour,
		Seed:       1,
	})
}

// BenchmarkSchedulerStep measures one replica's scheduling and output
// processing with 32 running requests in decode: it must not allocate.
func BenchmarkSchedulerStep(b *testing.B) {
	cfg := &engineConfig{blockSize: 16, maxNumSeqs: 32, maxNumBatchedTokens: 2048, numGPUBlocks: 20000}
	r := newReplica(0, cfg, newEverSet(1))
	g := traces.NewGenerator(traces.DefaultWorkload(), 16, 1)
	for i := range 32 {
		s, _ := g.NextSession()
		req := s.Turns[0]
		req.OutputTokens = 1 << 30
		r.add(&seq{id: i, req: &req, prompt: req.PromptTokens, output: req.OutputTokens, numTokens: req.PromptTokens, firstTokenUs: -1})
	}
	done := func(*seq, bool) {}
	for r.running == nil || len(r.running) < 32 || r.running[31].computed < r.running[31].numTokens-1 {
		r.schedule()
		r.finishStep(0, done)
	}
	b.ReportAllocs()
	for b.Loop() {
		r.schedule()
		r.finishStep(0, done)
	}
}
