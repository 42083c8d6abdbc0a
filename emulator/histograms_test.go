package emulator

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/model/labels"

	"github.com/lm-warden/warden/metrics"
	"github.com/lm-warden/warden/metrics/names"
	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/traces"
)

// TestHistogramsAgreeWithSimulator: the same requests, sent one at a time
// to the emulator over HTTP and replayed closed-loop by the simulator, give
// the same vLLM histograms on /metrics as in the simulator's store: every
// histogram of sim.EngineHistogramDescs, with equal counts and buckets and
// sums equal to rounding (one request at a time, the model's times do not
// depend on the wall clock).
func TestHistogramsAgreeWithSimulator(t *testing.T) {
	f := testFarm(t, 1, "")
	r := start(t, f, Options{Seed: 3})
	system := strings.Repeat("A system prompt shared by every session. ", 60)
	var reqs []*traces.Request
	for sess := range 3 {
		var turns, answers []string
		for turn := range 3 {
			turns = append(turns, fmt.Sprintf("Session %d, turn %d. ", sess, turn)+strings.Repeat("More context. ", 100*(sess+1)))
			body := chatBody(system, turns, answers, 20+13*turn+5*sess, turn%2 == 0)
			// The engine's view of the request, as the server builds it.
			raw, err := json.Marshal(body)
			if err != nil {
				t.Fatal(err)
			}
			pr, err := ParseRequest(APIChat, raw)
			if err != nil {
				t.Fatal(err)
			}
			er, _ := engineRequest(APIChat, pr, r.e.opts.Seed, f.Spec.VLLM.BlockSize)
			er.Session, er.Turn = fmt.Sprintf("s%d", sess), turn
			reqs = append(reqs, er)
			answers = append(answers, ask(t, r.urls[0], "/v1/chat/completions", body).text)
		}
	}
	fams := scrape(t, r.urls[0])

	var st *metrics.Store
	if _, err := sim.Run(context.Background(), sim.Experiment{
		Farm:       f,
		Strategies: []string{placement.StrategyLeastLoaded},
		Sessions:   []int{1},
		Trace:      &sim.Trace{Name: "emulated", Header: traces.Header{BlockSize: f.Spec.VLLM.BlockSize}, Requests: reqs},
		ClosedLoop: true,
		OnStore:    func(_ string, s *metrics.Store) { st = s },
	}); err != nil {
		t.Fatal(err)
	}
	last := func(name string, extra ...string) float64 {
		l := labels.FromStrings(append([]string{names.LabelName, name, names.LabelModelName, testModel, names.LabelEngine, "0"}, extra...)...)
		_, v, ok := st.Series(l).Last()
		if !ok {
			t.Fatalf("the simulator's store has no %s", l)
		}
		return v
	}

	descs := sim.EngineHistogramDescs(f.Spec.VLLM.MaxModelLen)
	if len(descs) != 9 {
		t.Errorf("%d histograms, want vLLM's 9", len(descs))
	}
	for _, d := range descs {
		fam := fams[d.Name]
		if fam == nil || len(fam.GetMetric()) != 1 || fam.GetType() != dto.MetricType_HISTOGRAM {
			t.Errorf("/metrics: %s missing or not one histogram", d.Name)
			continue
		}
		h := fam.GetMetric()[0].GetHistogram()
		count, sum := float64(h.GetSampleCount()), h.GetSampleSum()
		wantCount, wantSum := last(d.Name+names.CountSuffix), last(d.Name+names.SumSuffix)
		if count != wantCount || count == 0 {
			t.Errorf("%s: %g observations emulated, %g simulated: want equal and some", d.Name, count, wantCount)
		}
		if !(math.Abs(sum-wantSum) <= 1e-9*math.Max(1, math.Abs(wantSum))) {
			t.Errorf("%s: sum %g emulated, %g simulated: want equal", d.Name, sum, wantSum)
		}
		bounds := append(slices.Clone(d.Buckets), math.Inf(+1))
		if len(h.GetBucket()) != len(bounds) {
			t.Errorf("%s: %d buckets on /metrics, want %d", d.Name, len(h.GetBucket()), len(bounds))
			continue
		}
		for i, b := range h.GetBucket() {
			if b.GetUpperBound() != bounds[i] {
				t.Errorf("%s: bucket %d le=%g, want %g", d.Name, i, b.GetUpperBound(), bounds[i])
			}
			le := labels.FormatOpenMetricsFloat(bounds[i])
			if got, want := float64(b.GetCumulativeCount()), last(d.Name+names.BucketSuffix, names.LabelLE, le); got != want {
				t.Errorf("%s{le=%q}: %g emulated, %g simulated", d.Name, le, got, want)
			}
		}
	}
	// The counts themselves follow from the requests.
	var prompt, output float64
	for _, q := range reqs {
		prompt += float64(q.PromptTokens)
		output += float64(q.OutputTokens)
	}
	n := float64(len(reqs))
	for _, c := range []struct {
		name       string
		count, sum float64
	}{
		{names.VLLMRequestPromptTokens, n, prompt},
		{names.VLLMRequestGenerationTokens, n, output},
		{names.VLLMTimeToFirstToken, n, -1},
		{names.VLLMInterTokenLatency, output - n, -1},
		{names.VLLMRequestPrefillTime, n, -1},
	} {
		h := fams[c.name].GetMetric()[0].GetHistogram()
		if float64(h.GetSampleCount()) != c.count || (c.sum >= 0 && h.GetSampleSum() != c.sum) {
			t.Errorf("%s: %d observations summing to %g, want %g summing to %g", c.name, h.GetSampleCount(), h.GetSampleSum(), c.count, c.sum)
		}
	}
}
