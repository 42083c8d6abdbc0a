package sim

import (
	"context"
	"testing"
	"time"

	"github.com/lm-warden/warden/examples"
	"github.com/lm-warden/warden/placement"
)

// BenchmarkPeersSim64 is the simulator's cost per request with each
// routing at 64 replicas (the built-in A4000 farm grown to 64, 256 agent
// sessions for 2 simulated minutes): a peer's router must stay within 2x
// of affinity's (issue 47). Run with -benchtime=1x; compare the
// ns/request metric across the sub-benchmarks, or cpu-ns/request (the
// process's user + system time) on a loaded machine, where wall time
// counts the other processes' turns too.
func BenchmarkPeersSim64(b *testing.B) {
	f, err := ParseFarmWith(examples.Default, examples.DefaultName, func(s *FarmSpec) { s.Replicas = 64 })
	if err != nil {
		b.Fatal(err)
	}
	for _, name := range append([]string{placement.StrategyAffinity}, placement.PeerNames()...) {
		b.Run(name, func(b *testing.B) {
			e := Experiment{Farm: f, Strategies: []string{name}, Sessions: []int{256}, Duration: 2 * time.Minute, Seed: 1}
			var requests int64
			start, cpu0 := time.Now(), cpuTime()
			for b.Loop() {
				rep, err := Run(context.Background(), e)
				if err != nil {
					b.Fatal(err)
				}
				requests += rep.Rows[0].Finished + rep.Rows[0].Unfinished
			}
			if requests > 0 {
				b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(requests), "ns/request")
				b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(requests), "cpu-ns/request")
			}
		})
	}
}
