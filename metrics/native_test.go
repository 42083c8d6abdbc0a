package metrics

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"

	"github.com/lm-warden/warden/metrics/names"
)

// sampleQuantile is the q-quantile of sorted values by linear interpolation
// between order statistics (position q*(n-1), numpy's default), the
// definition of the simulator's direct TTFB quantiles (sim/result.go's
// quantile) and of bench's exactQuantile.
func sampleQuantile(sorted []float64, q float64) float64 {
	pos := q * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(sorted)-1)
	return sorted[lo] + (sorted[hi]-sorted[lo])*(pos-float64(lo))
}

type ttfbDist struct {
	name string
	draw func(r *rand.Rand) float64
}

var ttfbDists = []ttfbDist{
	{"uniform 0.05-2s", func(r *rand.Rand) float64 { return 0.05 + 1.95*r.Float64() }},
	{"lognormal median 0.5s sigma 1", func(r *rand.Rand) float64 { return 0.5 * math.Exp(r.NormFloat64()) }},
	{"lognormal median 80ms sigma 0.3", func(r *rand.Rand) float64 { return 0.08 * math.Exp(0.3*r.NormFloat64()) }},
	{"bimodal 80ms / 6s", func(r *rand.Rand) float64 {
		if r.IntN(10) < 7 {
			return math.Abs(0.08 + 0.01*r.NormFloat64())
		}
		return 6 * math.Exp(0.4*r.NormFloat64())
	}},
	{"uniform 200-3500s (beyond the classic buckets)", func(r *rand.Rand) float64 { return 200 + 3300*r.Float64() }},
}

// TestTTFBQuantileAccuracy feeds known samples into warden_ttfb_seconds
// (classic and native, as the simulator writes it) and checks that the
// TTFB KPIs of kpi.promql, through the evaluator, give the exact sample
// quantile (linear interpolation, as the simulator's direct counts) within
// 2%, for every distribution and size. (The expressions interpolate between
// the two order statistics that the exact quantile interpolates between,
// each located within one native bucket, 2^(1/128) = 0.54%; a plain
// histogram_quantile(q, h) would answer at one of them, which for p95 of
// 50 lognormal samples is up to 28% away.)
func TestTTFBQuantileAccuracy(t *testing.T) {
	ev := NewEvaluator()
	kpi := map[float64]KPI{}
	for q, name := range map[float64]string{0.5: "ttfb_p50_s", 0.95: "ttfb_p95_s"} {
		k, ok := KPIByName(name)
		if !ok {
			t.Fatalf("no KPI %s", name)
		}
		kpi[q] = k
	}
	const window = 180 * time.Second
	maxErr := map[int]float64{}
	for _, d := range ttfbDists {
		for _, n := range []int{50, 200, 1000, 10_000} {
			t.Run(fmt.Sprintf("%s/n=%d", d.name, n), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(n), 7))
				st := NewStore()
				h := NewHistogram(st, names.WardenTTFB, labels.FromStrings(names.LabelModel, "m"), names.WardenTTFBBuckets()).
					WithNative(st, names.WardenTTFBNative())
				// 60 s of other samples before the window and after it,
				// which the window must not count; scrapes every second.
				sec := int64(0)
				scrape := func(obs int, keep *[]float64) {
					for range obs {
						v := d.draw(rng) * 3 // a different distribution
						if keep != nil {
							v = d.draw(rng)
							*keep = append(*keep, v)
						}
						h.Observe(v)
					}
					h.Append(sec * 1000)
					sec++
				}
				for range 60 {
					scrape(5, nil)
				}
				start := sec - 1
				var in []float64
				secs := int(window / time.Second)
				for i := range secs {
					scrape((i+1)*n/secs-i*n/secs, &in)
				}
				end := sec - 1
				for range 30 {
					scrape(5, nil)
				}
				if len(in) != n || end-start != int64(secs) {
					t.Fatalf("fixture: %d samples over %d s", len(in), end-start)
				}
				slices.Sort(in)
				for _, q := range []float64{0.5, 0.95} {
					got, err := ev.Scalar(context.Background(), st, Expand(kpi[q].Expr, "m", window), time.UnixMilli(end*1000))
					if err != nil {
						t.Fatal(err)
					}
					want := sampleQuantile(in, q)
					rel := math.Abs(got-want) / want
					maxErr[n] = max(maxErr[n], rel)
					if !(rel <= 0.02) {
						t.Errorf("q=%v: %v, exact %v: relative error %.2f%% > 2%%", q, got, want, 100*rel)
					}
					t.Logf("q=%v: PromQL %.6g exact %.6g error %+.3f%%", q, got, want, 100*(got-want)/want)
				}
			})
		}
	}
	for _, n := range []int{50, 200, 1000, 10_000} {
		t.Logf("n=%5d: max relative error %.3f%%", n, 100*maxErr[n])
	}
}

// TestNativeMatchesClientGolang observes the same values in client_golang's
// histogram (as live mode configures it) and in a NativeHistogram: the
// buckets, counts and sum must be identical, and so must the schema after
// the bucket limit halved the resolution.
func TestNativeMatchesClientGolang(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    names.NativeOpts
		draw func(r *rand.Rand) float64
		n    int
	}{
		{"ttfb", names.WardenTTFBNative(), func(r *rand.Rand) float64 { return 0.3 * math.Exp(1.5*r.NormFloat64()) }, 20000},
		{"edges", names.WardenTTFBNative(), func(r *rand.Rand) float64 {
			return []float64{0, 1, 0.5, 2, 1e-40, -3, -0.25, math.Inf(1), math.Inf(-1), math.NaN(), math.MaxFloat64, math.SmallestNonzeroFloat64}[r.IntN(12)]
		}, 500},
		{"limit halves the resolution", names.NativeOpts{BucketFactor: 1.01, MaxBuckets: 100}, func(r *rand.Rand) float64 { return math.Exp(3 * r.NormFloat64()) }, 5000},
		{"schema 0", names.NativeOpts{BucketFactor: 2}, func(r *rand.Rand) float64 { return math.Exp(3 * r.NormFloat64()) }, 2000},
		{"schema -2", names.NativeOpts{BucketFactor: 16}, func(r *rand.Rand) float64 { return math.Exp(5 * r.NormFloat64()) }, 2000},
		{"schema 8", names.NativeOpts{BucketFactor: 1.005}, func(r *rand.Rand) float64 { return math.Exp(r.NormFloat64()) }, 2000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cg := prometheus.NewHistogram(prometheus.HistogramOpts{
				Name: "x", Help: "x",
				NativeHistogramBucketFactor:    tc.o.BucketFactor,
				NativeHistogramMaxBucketNumber: uint32(tc.o.MaxBuckets),
			})
			st := NewStore()
			nh := NewNativeHistogram(st, "x", labels.EmptyLabels(), tc.o)
			rng := rand.New(rand.NewPCG(3, 4))
			for i := range tc.n {
				v := tc.draw(rng)
				cg.Observe(v)
				nh.Observe(v)
				if i%97 == 0 || i == tc.n-1 {
					nh.Append(int64(i))
				}
			}
			var m dto.Metric
			if err := cg.Write(&m); err != nil {
				t.Fatal(err)
			}
			want := dtoToFloat(m.GetHistogram())
			got := readLast(t, st, "x")
			if got.Schema != want.Schema || got.Count != want.Count || !sameFloat(got.Sum, want.Sum) || got.ZeroCount != want.ZeroCount || got.ZeroThreshold != want.ZeroThreshold {
				t.Fatalf("got schema %d count %v sum %v zero %v/%v, want %d %v %v %v/%v",
					got.Schema, got.Count, got.Sum, got.ZeroCount, got.ZeroThreshold, want.Schema, want.Count, want.Sum, want.ZeroCount, want.ZeroThreshold)
			}
			if g, w := bucketMap(got.PositiveBucketIterator()), bucketMap(want.PositiveBucketIterator()); !mapsEqual(g, w) {
				t.Errorf("positive buckets differ: %d vs %d buckets", len(g), len(w))
			}
			if g, w := bucketMap(got.NegativeBucketIterator()), bucketMap(want.NegativeBucketIterator()); !mapsEqual(g, w) {
				t.Errorf("negative buckets differ: %d vs %d buckets", len(g), len(w))
			}
			if tc.o.MaxBuckets == 100 && got.Schema >= tc.o.Schema() {
				t.Errorf("schema %d: the bucket limit did not reduce the resolution", got.Schema)
			}
		})
	}
}

func sameFloat(a, b float64) bool { return a == b || math.IsNaN(a) && math.IsNaN(b) }

// dtoToFloat converts client_golang's exposition of a native histogram.
func dtoToFloat(h *dto.Histogram) *histogram.FloatHistogram {
	conv := func(sp []*dto.BucketSpan, deltas []int64) ([]histogram.Span, []float64) {
		var s []histogram.Span
		for _, x := range sp {
			if x.GetLength() > 0 {
				s = append(s, histogram.Span{Offset: x.GetOffset(), Length: x.GetLength()})
			}
		}
		var b []float64
		c := int64(0)
		for _, d := range deltas {
			c += d
			b = append(b, float64(c))
		}
		return s, b
	}
	fh := &histogram.FloatHistogram{
		Schema: h.GetSchema(), ZeroThreshold: h.GetZeroThreshold(), ZeroCount: float64(h.GetZeroCount()),
		Count: float64(h.GetSampleCount()), Sum: h.GetSampleSum(),
	}
	fh.PositiveSpans, fh.PositiveBuckets = conv(h.GetPositiveSpan(), h.GetPositiveDelta())
	fh.NegativeSpans, fh.NegativeBuckets = conv(h.GetNegativeSpan(), h.GetNegativeDelta())
	return fh
}

func bucketMap(it histogram.BucketIterator[float64]) map[int32]float64 {
	m := map[int32]float64{}
	for it.Next() {
		if b := it.At(); b.Count != 0 {
			m[b.Index] = b.Count
		}
	}
	return m
}

func mapsEqual(a, b map[int32]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// readLast reads the newest sample of the histogram series name through the
// store's querier, as the engine does.
func readLast(t *testing.T, st *Store, name string) *histogram.FloatHistogram {
	t.Helper()
	q, _ := st.Querier(math.MinInt64, math.MaxInt64)
	ss := q.Select(context.Background(), false, nil, labels.MustNewMatcher(labels.MatchEqual, names.LabelName, name))
	if !ss.Next() {
		t.Fatal("no series")
	}
	it := ss.At().Iterator(nil)
	var fh *histogram.FloatHistogram
	for vt := it.Next(); vt != 0; vt = it.Next() {
		_, fh = it.AtFloatHistogram(nil)
	}
	if fh == nil {
		t.Fatal("no sample")
	}
	return fh
}

// TestNativeSamplesRebuilt reads every sample of a long series, in order,
// backwards and by Seek, with and without a histogram to reuse: each must
// equal the histogram as it was when appended.
func TestNativeSamplesRebuilt(t *testing.T) {
	st := NewStore()
	nh := NewNativeHistogram(st, "x", labels.FromStrings("k", "v"), names.WardenTTFBNative())
	rng := rand.New(rand.NewPCG(5, 6))
	var want []*histogram.FloatHistogram
	ref := NewNativeHistogram(NewStore(), "ref", labels.EmptyLabels(), names.WardenTTFBNative())
	for sec := range 2000 {
		for range rng.IntN(4) {
			v := 0.2 * math.Exp(rng.NormFloat64())
			nh.Observe(v)
			ref.Observe(v)
		}
		nh.Append(int64(sec) * 1000)
		// The reference rebuilds from scratch every time.
		r := nativeReader{d: ref.d}
		want = append(want, r.at(nativePoint{n: len(ref.d.obs), count: ref.count, sum: ref.sum, schema: ref.schema}, nil))
	}
	if len(nh.d.ckpts) == 0 {
		t.Fatal("no checkpoint in 2000 scrapes")
	}
	q, _ := st.Querier(0, math.MaxInt64)
	view := func() *seriesView {
		ss := q.Select(context.Background(), false, nil, labels.MustNewMatcher(labels.MatchEqual, names.LabelName, "x"))
		if !ss.Next() {
			t.Fatal("no series")
		}
		return ss.At().(*seriesView)
	}
	check := func(how string, i int, fh *histogram.FloatHistogram) {
		t.Helper()
		if !fh.Equals(want[i]) {
			t.Fatalf("%s: sample %d differs:\n got %s\nwant %s", how, i, fh, want[i])
		}
	}
	it := view().Iterator(nil)
	reuse := &histogram.FloatHistogram{}
	for i := 0; it.Next() != 0; i++ {
		_, fh := it.AtFloatHistogram(reuse)
		check("in order", i, fh)
	}
	for i := 1999; i >= 0; i -= 37 {
		it := view().Iterator(it)
		if it.Seek(int64(i)*1000) == 0 {
			t.Fatalf("seek %d: none", i)
		}
		_, fh := it.AtFloatHistogram(nil)
		check("seek", i, fh)
	}
	if _, v, ok := st.Series(labels.FromStrings(names.LabelName, "x", "k", "v")).Last(); !ok || v != nh.count {
		t.Errorf("Last = %v, want the count %v", v, nh.count)
	}
}

func TestNativeSchema(t *testing.T) {
	for f, want := range map[float64]int32{1.01: 7, 1.005: 8, 1.0001: 8, 1.1: 3, 2: 0, 4: -1, 1e9: -4, 1.02: 6} {
		if got := (names.NativeOpts{BucketFactor: f}).Schema(); got != want {
			t.Errorf("Schema(%v) = %d, want %d", f, got, want)
		}
	}
	if s := names.WardenTTFBNative().Schema(); s != 7 {
		t.Errorf("warden_ttfb_seconds schema %d, want 7", s)
	}
}

func TestNativeMisuse(t *testing.T) {
	st := NewStore()
	sr := st.Series(labels.FromStrings(names.LabelName, "f"))
	sr.Append(0, 1)
	mustPanic(t, "native over floats", func() { NewNativeHistogram(st, "f", labels.EmptyLabels(), names.WardenTTFBNative()) })
	nh := NewNativeHistogram(st, "h", labels.EmptyLabels(), names.WardenTTFBNative())
	nh.Append(1000)
	mustPanic(t, "float into native", func() { st.Series(labels.FromStrings(names.LabelName, "h")).Append(2000, 1) })
	mustPanic(t, "out of order", func() { nh.Append(500) })
	mustPanic(t, "factor 1", func() { NewNativeHistogram(st, "g", labels.EmptyLabels(), names.NativeOpts{BucketFactor: 1}) })
	mustPanic(t, "empty name", func() { NewNativeHistogram(st, "", labels.EmptyLabels(), names.WardenTTFBNative()) })
	nh.Observe(2)
	nh.Append(1000) // same instant: replaces
	if n := st.Series(labels.FromStrings(names.LabelName, "h")).Len(); n != 1 {
		t.Errorf("%d samples after two appends at one instant, want 1", n)
	}
	h := NewHistogram(st, "c", labels.EmptyLabels(), []float64{1}).WithNative(st, names.WardenTTFBNative())
	mustPanic(t, "WithNative twice", func() { h.WithNative(st, names.WardenTTFBNative()) })
	if h.Native() == nil || h.Native().sr.Labels().Get(names.LabelName) != "c" {
		t.Error("WithNative: no native series c")
	}
}

func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s: no panic", what)
		}
	}()
	f()
}
