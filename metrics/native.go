package metrics

import (
	"fmt"
	"math"
	"sort"
	"sync"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"

	"github.com/lm-warden/warden/metrics/names"
)

// nativeZeroThreshold is client_golang's DefNativeHistogramZeroThreshold
// (2^-128): observations of at most this magnitude count in the zero bucket.
const nativeZeroThreshold = 2.938735877055719e-39

// NativeHistogram accumulates observations into a Prometheus native
// histogram (exponential buckets, as client_golang's with a
// NativeHistogramBucketFactor: the same bucket for every value, bit for
// bit) and writes it to a [Store] as one histogram series called name,
// which the PromQL engine reads as float-histogram samples.
//
// Memory does not grow with buckets times scrapes: the store keeps the
// observations' bucket keys in order (4 bytes each), a 32-byte record per
// scrape, and a full copy of the buckets every few hundred observations;
// a sample is rebuilt from those when the engine reads it.
type NativeHistogram struct {
	sr     *Series
	d      *nativeData
	max    int
	schema int32            // current schema, <= d.schema0
	pop    map[int64]uint32 // populated buckets at schema: sign<<32 | key
	st     nativeState      // every observation, at d.schema0
	count  float64          // observations, NaN included
	sum    float64
}

// NewNativeHistogram creates the histogram series name (a __name__ in l is
// replaced) with the extra labels l. It panics on an empty name, a bucket
// factor <= 1, or when the series already exists with float samples.
func NewNativeHistogram(s *Store, name string, l labels.Labels, o names.NativeOpts) *NativeHistogram {
	if name == "" {
		panic("metrics: NewNativeHistogram: empty name")
	}
	schema := o.Schema()
	b := labels.NewBuilder(l)
	b.Set(names.LabelName, name)
	sr := s.Series(b.Labels())
	if sr.Len() > 0 && sr.nh == nil {
		panic(fmt.Sprintf("metrics: NewNativeHistogram: %s already has float samples", sr.lset))
	}
	if sr.nh == nil {
		sr.nh = &nativeData{schema0: schema, bounds: nativeBounds(schema)}
	}
	return &NativeHistogram{sr: sr, d: sr.nh, max: o.MaxBuckets, schema: schema, pop: map[int64]uint32{}}
}

// Observe records one observation, as client_golang does: NaN counts in
// the count (and makes the sum NaN) but in no bucket; ±Inf fall in the
// bucket after the one of ±MaxFloat64.
func (h *NativeHistogram) Observe(v float64) {
	h.count++
	h.sum += v
	if math.IsNaN(v) {
		return
	}
	var e int32
	switch {
	case v > nativeZeroThreshold:
		e = h.d.key(v) << 1
	case v < -nativeZeroThreshold:
		e = h.d.key(v)<<1 | 1
	default:
		e = zeroObs
	}
	h.d.obs = append(h.d.obs, e)
	h.st.add(e)
	if e == zeroObs {
		return
	}
	h.pop[popKey(reduceKey(e>>1, h.d.schema0-h.schema), e&1)]++
	for h.max > 0 && len(h.pop) > h.max && h.schema > -4 {
		h.schema--
		old := h.pop
		h.pop = make(map[int64]uint32, len(old)/2+1)
		for k, n := range old {
			h.pop[popKey(reduceKey(int32(k), 1), int32(k>>32))] += n
		}
	}
}

func popKey(key, neg int32) int64 { return int64(neg)<<32 | int64(uint32(key)) }

// Count reports the number of observations so far (NaN included).
func (h *NativeHistogram) Count() uint64 { return uint64(h.count) }

// Sum reports the sum of all observations so far.
func (h *NativeHistogram) Sum() float64 { return h.sum }

// Schema reports the current schema: [NativeOpts.Schema] until more than
// MaxBuckets buckets were populated, lower after.
func (h *NativeHistogram) Schema() int32 { return h.schema }

// Append writes the histogram as it is now as a sample at tMs
// (milliseconds, non-decreasing; a sample at the newest timestamp replaces
// it, as [Series.Append] does).
func (h *NativeHistogram) Append(tMs int64) {
	sr, d := h.sr, h.d
	p := nativePoint{n: len(d.obs), count: h.count, sum: h.sum, schema: h.schema, hint: histogram.UnknownCounterReset}
	if n := len(sr.ts); n > 0 {
		p.hint = histogram.NotCounterReset
		switch last := sr.ts[n-1]; {
		case tMs == last:
			p.hint = d.pts[n-1].hint // a replaced first sample stays the first
			d.pts[n-1] = p
			h.checkpoint()
			return
		case tMs < last:
			panic(fmt.Sprintf("metrics: out-of-order sample for %s: t=%d ms after t=%d ms", sr.lset, tMs, last))
		}
	}
	sr.ts = append(sr.ts, tMs)
	d.pts = append(d.pts, p)
	h.checkpoint()
}

// checkpoint saves a copy of the buckets when enough observations came
// since the last copy that replaying them costs about as much as copying
// the buckets: a sample is then rebuilt in time proportional to its
// number of buckets, and the copies cost about 8 bytes per observation.
func (h *NativeHistogram) checkpoint() {
	d := h.d
	last := 0
	if n := len(d.ckpts); n > 0 {
		last = d.ckpts[n-1].n
	}
	if len(d.obs)-last >= max(checkpointMin, len(h.st.pos.c)+len(h.st.neg.c)) {
		var c nativeState
		c.copyFrom(&h.st)
		d.ckpts = append(d.ckpts, c)
	}
}

// checkpointMin is the fewest observations between two checkpoints.
const checkpointMin = 256

// zeroObs encodes an observation in the zero bucket; any other is
// key<<1 | (1 if negative). Keys of schema 8 lie within ±2^19, so the
// encoding never collides with zeroObs.
const zeroObs = math.MinInt32

// reduceKey maps the key of a bucket at schema s to the key of the bucket
// that holds it at schema s-delta: ceil(key / 2^delta).
func reduceKey(key, delta int32) int32 {
	if delta == 0 {
		return key
	}
	return ((key - 1) >> delta) + 1
}

// nativeData is the histogram part of a [Series]: the observation log,
// one point per sample (aligned with Series.ts) and the checkpoints.
type nativeData struct {
	schema0 int32
	bounds  []float64 // for schema0 > 0: the fraction bounds of client_golang
	obs     []int32   // encoded observations, in order
	pts     []nativePoint
	ckpts   []nativeState // ascending n
}

// nativePoint is one sample: the first n observations of the log, at schema.
//
// hint is NotCounterReset for every sample after the first (the counts only
// grow; a lower schema is no reset), as Prometheus's TSDB marks a sample it
// knows continues the previous one: increase() then skips comparing every
// pair of samples bucket by bucket, which would cost O(buckets) per sample.
type nativePoint struct {
	n          int
	count, sum float64
	schema     int32
	hint       histogram.CounterResetHint
}

// key returns the bucket key of v (not NaN, |v| above the zero threshold)
// at schema0, as client_golang's histogramCounts.observe computes it.
func (d *nativeData) key(v float64) int32 {
	isInf := false
	if math.IsInf(v, 0) {
		v = math.Copysign(math.MaxFloat64, v)
		isInf = true
	}
	frac, exp := math.Frexp(math.Abs(v))
	var key int
	if d.schema0 > 0 {
		key = sort.SearchFloat64s(d.bounds, frac) + (exp-1)*len(d.bounds)
	} else {
		key = exp
		if frac == 0.5 {
			key--
		}
		key = (key + (1 << -d.schema0) - 1) >> -d.schema0
	}
	if isInf {
		key++
	}
	return int32(key)
}

var (
	boundsMu    sync.Mutex
	boundsCache = map[int32][]float64{}
)

// nativeBounds returns, for a schema s > 0, the 2^s fraction bounds that
// client_golang searches to find a bucket (its nativeHistogramBounds):
// the upper bounds of buckets 0..2^s-1 halved. They are read from
// Prometheus's own bucket bounds, which are the same table: computing
// 2^(i/2^s) here would differ in the last bit for a third of them.
func nativeBounds(s int32) []float64 {
	if s <= 0 {
		return nil
	}
	boundsMu.Lock()
	defer boundsMu.Unlock()
	if b, ok := boundsCache[s]; ok {
		return b
	}
	n := 1 << s
	fh := &histogram.FloatHistogram{
		Schema:          s,
		PositiveSpans:   []histogram.Span{{Offset: 0, Length: uint32(n)}},
		PositiveBuckets: make([]float64, n),
	}
	for i := range fh.PositiveBuckets {
		fh.PositiveBuckets[i] = 1
	}
	b := make([]float64, 0, n)
	for it := fh.PositiveBucketIterator(); it.Next(); {
		b = append(b, it.At().Upper/2)
	}
	boundsCache[s] = b
	return b
}

// nativeState is a histogram's buckets at one schema after its first n
// observations.
type nativeState struct {
	n        int
	zero     float64
	pos, neg denseCounts
}

// denseCounts are bucket counts by key: c[i] counts key off+i.
type denseCounts struct {
	off int32
	c   []float64
}

func (dc *denseCounts) inc(key int32, by float64) {
	switch {
	case len(dc.c) == 0:
		dc.off = key
		dc.c = append(dc.c[:0], by)
		return
	case key < dc.off:
		grow := int(dc.off - key)
		dc.c = append(dc.c, make([]float64, grow)...)
		copy(dc.c[grow:], dc.c[:len(dc.c)-grow])
		clear(dc.c[:grow])
		dc.off = key
	case int(key-dc.off) >= len(dc.c):
		dc.c = append(dc.c, make([]float64, int(key-dc.off)+1-len(dc.c))...)
	}
	dc.c[key-dc.off] += by
}

func (dc *denseCounts) copyFrom(o *denseCounts) {
	dc.off = o.off
	dc.c = append(dc.c[:0], o.c...)
}

// add applies one encoded observation.
func (s *nativeState) add(e int32) {
	s.n++
	switch {
	case e == zeroObs:
		s.zero++
	case e&1 == 0:
		s.pos.inc(e>>1, 1)
	default:
		s.neg.inc(e>>1, 1)
	}
}

func (s *nativeState) copyFrom(o *nativeState) {
	s.n, s.zero = o.n, o.zero
	s.pos.copyFrom(&o.pos)
	s.neg.copyFrom(&o.neg)
}

func (s *nativeState) reset() {
	s.n, s.zero = 0, 0
	s.pos.c, s.neg.c = s.pos.c[:0], s.neg.c[:0]
}

// nativeReader rebuilds samples of one nativeData; an iterator owns one,
// so that reading samples in time order replays each observation once.
type nativeReader struct {
	d   *nativeData
	st  nativeState // at d.schema0
	red nativeState // scratch for a reduced schema
}

// at rebuilds point p into fh (a new histogram when fh is nil) and
// returns it.
func (r *nativeReader) at(p nativePoint, fh *histogram.FloatHistogram) *histogram.FloatHistogram {
	d := r.d
	if r.st.n > p.n {
		r.st.reset()
	}
	// The newest checkpoint at or before p, if it is ahead of st.
	if i := sort.Search(len(d.ckpts), func(i int) bool { return d.ckpts[i].n > p.n }) - 1; i >= 0 && d.ckpts[i].n > r.st.n {
		r.st.copyFrom(&d.ckpts[i])
	}
	for _, e := range d.obs[r.st.n:p.n] {
		r.st.add(e)
	}
	src := &r.st
	if delta := d.schema0 - p.schema; delta > 0 {
		r.red.reset()
		r.red.n, r.red.zero = r.st.n, r.st.zero
		for i, c := range r.st.pos.c {
			if c != 0 {
				r.red.pos.inc(reduceKey(r.st.pos.off+int32(i), delta), c)
			}
		}
		for i, c := range r.st.neg.c {
			if c != 0 {
				r.red.neg.inc(reduceKey(r.st.neg.off+int32(i), delta), c)
			}
		}
		src = &r.red
	}
	if fh == nil {
		fh = &histogram.FloatHistogram{}
	}
	ps, pb, ns, nb := fh.PositiveSpans[:0], fh.PositiveBuckets[:0], fh.NegativeSpans[:0], fh.NegativeBuckets[:0]
	*fh = histogram.FloatHistogram{
		CounterResetHint: p.hint,
		Schema:           p.schema,
		ZeroThreshold:    nativeZeroThreshold,
		ZeroCount:        src.zero,
		Count:            p.count,
		Sum:              p.sum,
	}
	fh.PositiveSpans, fh.PositiveBuckets = spans(&src.pos, ps, pb)
	fh.NegativeSpans, fh.NegativeBuckets = spans(&src.neg, ns, nb)
	return fh
}

// spans appends the populated buckets of dc as Prometheus spans and bucket
// counts (absolute, as a FloatHistogram holds them).
func spans(dc *denseCounts, sp []histogram.Span, bs []float64) ([]histogram.Span, []float64) {
	prev, started := int32(0), false
	for i, c := range dc.c {
		if c == 0 {
			continue
		}
		k := dc.off + int32(i)
		switch {
		case !started:
			sp = append(sp, histogram.Span{Offset: k, Length: 1})
			started = true
		case k == prev+1:
			sp[len(sp)-1].Length++
		default:
			sp = append(sp, histogram.Span{Offset: k - prev - 1, Length: 1})
		}
		bs = append(bs, c)
		prev = k
	}
	return sp, bs
}
