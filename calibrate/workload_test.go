package calibrate

import (
	"context"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/metrics"
	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/traces"
)

// meanPrompt is the mean prompt of n sessions drawn from w.
func meanPrompt(w traces.Workload, n int) float64 {
	g := traces.NewGenerator(w, 16, 11)
	var sum float64
	var k int
	for range n {
		s, _ := g.NextSession()
		for _, r := range s.Turns {
			sum += float64(r.PromptTokens)
			k++
		}
	}
	return sum / float64(k)
}

func TestDeriveWorkloadRecoversSessionsAndPrompts(t *testing.T) {
	st, w, _ := observed(t, []int{4, 8}, 3*time.Minute)
	est, err := DeriveWorkload(context.Background(), &metrics.StoreSource{St: st}, WorkloadOptions{Model: testModel, Window: w, Windows: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("estimate: %+v", est)
	for i, want := range []float64{4, 8} {
		if got := float64(est.Windows[i].Sessions); !within(got, want, 0.15) {
			t.Errorf("window %d: %.2f concurrent sessions, want %g within 15%%", i, got, want)
		}
	}
	if !within(est.Sessions, 6, 0.15) {
		t.Errorf("mean concurrent sessions %.2f, want 6 within 15%%", est.Sessions)
	}
	truth := meanPrompt(traces.DefaultWorkload(), 400)
	if got := meanPrompt(est.Workload, 400); !within(got, truth, 0.15) {
		t.Errorf("mean prompt of the derived workload %.0f, want %.0f within 15%%", got, truth)
	}
	if !within(est.MeanPromptTokens, truth, 0.15) {
		t.Errorf("observed mean prompt %.0f, want %.0f within 15%%", est.MeanPromptTokens, truth)
	}
	// Every step of the simulation starts fresh sessions and cuts those in
	// flight at its end, so fewer later turns are seen than in a steady
	// closed loop: 5 or 6.
	if est.Workload.Turns < 5 || est.Workload.Turns > 6 {
		t.Errorf("turns %d, want 6 (5 with the sessions cut at step ends)", est.Workload.Turns)
	}
	data, err := MarshalWorkload(est.Workload, []string{"derived"})
	if err != nil {
		t.Fatal(err)
	}
	back, err := traces.ParseWorkload(data, "workload.yaml")
	if err != nil {
		t.Fatalf("%v\n%s", err, data)
	}
	if !reflect.DeepEqual(back, est.Workload) {
		t.Errorf("workload YAML read back %+v, want %+v", back, est.Workload)
	}
}

func TestClearErrors(t *testing.T) {
	st, w, _ := observed(t, []int{2}, time.Minute)
	src := &metrics.StoreSource{St: st}
	ctx := context.Background()

	_, err := Calibrate(ctx, src, Options{Model: "no/such-model", GPU: "RTX A4000", Window: w})
	var um *UnknownModelError
	if !errors.As(err, &um) || !strings.Contains(err.Error(), testModel) {
		t.Errorf("unknown model: got %v, want an UnknownModelError listing %s", err, testModel)
	}

	empty := Window{Start: w.End.Add(time.Hour), End: w.End.Add(2 * time.Hour)}
	_, err = DeriveWorkload(ctx, src, WorkloadOptions{Model: testModel, Window: empty})
	var nd *NoDataError
	if !errors.As(err, &nd) || !strings.Contains(err.Error(), "vllm:num_requests_running") {
		t.Errorf("empty window: got %v, want a NoDataError naming vllm:num_requests_running", err)
	}

	prom, err := metrics.NewPrometheus("http://127.0.0.1:1", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Calibrate(ctx, prom, Options{Model: testModel, GPU: "RTX A4000", Window: w})
	var ue *metrics.UnreachableError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "http://127.0.0.1:1") {
		t.Errorf("unreachable: got %v, want an UnreachableError naming the URL", err)
	}
	if _, err := metrics.NewPrometheus("localhost:9090", 0); err == nil {
		t.Error("a URL without scheme was accepted")
	}
}

// TestDeriveWorkloadAnswerSpread: the answers' spread comes from vLLM's
// histogram of them (vllm:request_generation_tokens_bucket), not a
// default.
func TestDeriveWorkloadAnswerSpread(t *testing.T) {
	farm, err := sim.Resolve(truthSpec())
	if err != nil {
		t.Fatal(err)
	}
	w := traces.DefaultWorkload()
	w.OutputTokens, w.OutputTokensMean, w.OutputTokensSigma, w.MaxOutputTokens = traces.OutputLognormal, 300, 0.9, 4096
	var st *metrics.Store
	step := 2 * time.Minute
	if _, err := sim.Run(context.Background(), sim.Experiment{Farm: farm, Strategies: []string{placement.StrategyAffinity},
		Sessions: []int{6, 6}, Duration: step, Seed: 3, Workload: w, OnStore: func(_ string, s *metrics.Store) { st = s }}); err != nil {
		t.Fatal(err)
	}
	est, err := DeriveWorkload(context.Background(), &metrics.StoreSource{St: st},
		WorkloadOptions{Model: testModel, Window: Window{Start: time.UnixMilli(0).Add(step), End: time.UnixMilli(0).Add(2 * step)}})
	if err != nil {
		t.Fatal(err)
	}
	if got := est.Workload.OutputTokensSigma; math.Abs(got-0.9) > 0.25 || est.Workload.OutputTokens != traces.OutputLognormal {
		t.Errorf("answers %s sigma %g, want lognormal with sigma about 0.9 (vLLM's buckets are coarse)", est.Workload.OutputTokens, got)
	}
	// Round trip of every preset through the YAML warden workload writes.
	for _, n := range traces.PresetNames() {
		p, _ := traces.Preset(n)
		data, err := MarshalWorkload(p, []string{n})
		if err != nil {
			t.Fatal(err)
		}
		back, err := traces.ParseWorkload(data, n+".yaml")
		if err != nil || !reflect.DeepEqual(back, p) {
			t.Errorf("preset %s does not read back: %v\n%s", n, err, data)
		}
	}
}
