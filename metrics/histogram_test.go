package metrics

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/prometheus/model/labels"

	"github.com/lm-warden/warden/metrics/names"
)

func TestHistogram(t *testing.T) {
	s := NewStore()
	h := NewHistogram(s, "lat_seconds", labels.FromStrings("model", "m"), []float64{0.5, 1, 2.5, math.Inf(+1)})
	h.Append(0) // all zero
	for _, v := range []float64{0.1, 0.5, 0.7, 1, 3, 100} {
		h.Observe(v)
	}
	h.Append(1000)
	h.Observe(math.NaN()) // +Inf bucket only
	h.Append(1000)        // same instant: replaces

	got := map[string][]float64{}
	for _, sr := range s.all {
		got[sr.Labels().String()] = append([]float64(nil), sr.vs...)
	}
	want := map[string][]float64{
		`{__name__="lat_seconds_bucket", le="0.5", model="m"}`:  {0, 2},
		`{__name__="lat_seconds_bucket", le="1.0", model="m"}`:  {0, 4},
		`{__name__="lat_seconds_bucket", le="2.5", model="m"}`:  {0, 4},
		`{__name__="lat_seconds_bucket", le="+Inf", model="m"}`: {0, 7},
		`{__name__="lat_seconds_sum", model="m"}`:               {0, math.NaN()},
		`{__name__="lat_seconds_count", model="m"}`:             {0, 7},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b float64) bool {
		return a == b || (math.IsNaN(a) && math.IsNaN(b))
	})); diff != "" {
		t.Errorf("series (-want +got):\n%s", diff)
	}
	if h.Count() != 7 || !math.IsNaN(h.Sum()) {
		t.Errorf("Count, Sum = %d, %v; want 7, NaN", h.Count(), h.Sum())
	}
}

func TestHistogramLabelsOverrideName(t *testing.T) {
	s := NewStore()
	NewHistogram(s, "h", labels.FromStrings(names.LabelName, "ignored", "a", "b"), nil)
	for _, sr := range s.all {
		if n := sr.Labels().Get(names.LabelName); n != "h_bucket" && n != "h_sum" && n != "h_count" {
			t.Errorf("series %s: unexpected name", sr.Labels())
		}
	}
	if s.Len() != 3 { // +Inf bucket, sum, count
		t.Errorf("%d series, want 3", s.Len())
	}
}

func TestHistogramBadBoundsPanic(t *testing.T) {
	for name, bounds := range map[string][]float64{
		"decreasing": {1, 0.5},
		"equal":      {1, 1},
		"NaN":        {math.NaN()},
		"-Inf":       {math.Inf(-1), 1},
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("bounds %v did not panic", bounds)
				}
			}()
			NewHistogram(NewStore(), "h", labels.EmptyLabels(), bounds)
		})
	}
}

func TestBuckets(t *testing.T) {
	v := names.VLLMTTFTBuckets()
	if len(v) != 22 || v[0] != 0.001 || v[21] != 2560 {
		t.Errorf("vLLM TTFT buckets: %d bounds from %v to %v, want 22 from 0.001 to 2560", len(v), v[0], v[len(v)-1])
	}
	w := names.WardenTTFBBuckets()
	if len(w) != 21 || w[0] != 0.005 || math.Abs(w[20]-5242.88) > 1e-9 || w[20] < time.Hour.Seconds() {
		t.Errorf("warden TTFB buckets: %v", w)
	}
	v[0] = 42
	if names.VLLMTTFTBuckets()[0] != 0.001 {
		t.Error("names.VLLMTTFTBuckets returns shared memory")
	}
	// Both must be accepted by NewHistogram (strictly increasing, finite).
	NewHistogram(NewStore(), "a", labels.EmptyLabels(), names.VLLMTTFTBuckets())
	NewHistogram(NewStore(), "b", labels.EmptyLabels(), names.WardenTTFBBuckets())
}

func TestTokenBuckets(t *testing.T) {
	if got := names.VLLMTokenBuckets(0); len(got) != 19 || got[18] != 1_000_000 {
		t.Errorf("names.VLLMTokenBuckets(0) = %v, want 1, 2, 5, ... 1000000", got)
	}
	if got := names.VLLMTokenBuckets(2_500_000); got[len(got)-1] != 2_000_000 {
		t.Errorf("names.VLLMTokenBuckets(2500000) ends at %v, want 2000000", got[len(got)-1])
	}
	// A huge max_model_len must not overflow into negative bounds (it did:
	// an endless loop for math.MaxInt).
	got := names.VLLMTokenBuckets(math.MaxInt)
	if last := got[len(got)-1]; last != 5e18 {
		t.Errorf("names.VLLMTokenBuckets(MaxInt) ends at %v, want 5e18", last)
	}
	NewHistogram(NewStore(), "c", labels.EmptyLabels(), got)
}

// TestHistogramObserveN checks that n observations at once leave exactly
// the state of n single ones, the float _sum included (0.1 added ten
// times is not 0.1 x 10), native buckets too.
func TestHistogramObserveN(t *testing.T) {
	bounds := []float64{0.05, 0.5, 1}
	one := NewHistogram(NewStore(), "a_seconds", labels.EmptyLabels(), bounds).WithNative(NewStore(), names.WardenTTFBNative())
	many := NewHistogram(NewStore(), "a_seconds", labels.EmptyLabels(), bounds).WithNative(NewStore(), names.WardenTTFBNative())
	for _, c := range []struct {
		v float64
		n uint64
	}{{0.1, 10}, {0.006, 0}, {0.7, 3}, {0.1, 1}, {2, 7}, {0.003, 1000}} {
		for range c.n {
			one.Observe(c.v)
		}
		many.ObserveN(c.v, c.n)
	}
	if one.Sum() != many.Sum() || one.Count() != many.Count() || !cmp.Equal(one.counts, many.counts) {
		t.Fatalf("ObserveN: sum %v count %d buckets %v; Observe: sum %v count %d buckets %v",
			many.Sum(), many.Count(), many.counts, one.Sum(), one.Count(), one.counts)
	}
	if a, b := one.Native(), many.Native(); a.Count() != b.Count() || a.Sum() != b.Sum() {
		t.Fatalf("native: ObserveN count %d sum %v, Observe %d %v", b.Count(), b.Sum(), a.Count(), a.Sum())
	}
}
