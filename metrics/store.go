package metrics

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/lm-warden/warden/metrics/names"
)

// Store is an in-memory time-series store of float samples and native
// histogram samples that the PromQL engine can query: it implements
// [storage.Queryable].
//
// Writers obtain a [*Series] once with [Store.Series] and append samples to
// it in time order; a native histogram series is written by a
// [NativeHistogram] (its samples read as float histograms). There is no
// retention and no chunk compression: two slices per float series
// (timestamps and values), which is all a simulation of a few hours needs,
// and an observation log per histogram series (see [NativeHistogram]).
//
// Concurrency: the series index is guarded by a mutex, so Series, Querier and
// the querier's methods may be called from several goroutines. Sample slices
// are not: [Series.Append] must not run concurrently with a query or with
// another Append on the same Series. The simulator, which writes and queries
// on one goroutine, never does.
type Store struct {
	mu     sync.RWMutex
	byHash map[uint64][]*Series // labels.Hash() -> series (a slice for collisions)
	byName map[string][]*Series // __name__ -> series, in creation order
	all    []*Series            // creation order
}

// Series is one time series of a [Store]: a label set and its samples.
type Series struct {
	lset labels.Labels
	ts   []int64     // milliseconds, non-decreasing
	vs   []float64   // values, aligned with ts (float series)
	nh   *nativeData // non-nil for a native histogram series; its points align with ts
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{
		byHash: make(map[uint64][]*Series),
		byName: make(map[string][]*Series),
	}
}

// Series returns the series with exactly the label set l, creating it when it
// does not exist yet. l must hold a non-empty __name__ label; Series panics
// otherwise, because a nameless series is a programming error that the engine
// could never select by name.
func (s *Store) Series(l labels.Labels) *Series {
	name := l.Get(names.LabelName)
	if name == "" {
		panic(fmt.Sprintf("metrics: Store.Series: label set %s has no %s label", l, names.LabelName))
	}
	h := l.Hash()
	s.mu.RLock()
	sr := lookup(s.byHash[h], l)
	s.mu.RUnlock()
	if sr != nil {
		return sr
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sr := lookup(s.byHash[h], l); sr != nil { // created meanwhile
		return sr
	}
	sr = &Series{lset: l}
	s.byHash[h] = append(s.byHash[h], sr)
	s.byName[name] = append(s.byName[name], sr)
	s.all = append(s.all, sr)
	return sr
}

// lookup finds the series with label set l among those sharing its hash.
func lookup(cands []*Series, l labels.Labels) *Series {
	for _, c := range cands {
		if labels.Equal(c.lset, l) {
			return c
		}
	}
	return nil
}

// Len reports the number of series in the store.
func (s *Store) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.all)
}

// Grow makes room for n more samples in every series of the store, so that
// a writer that knows how many scrape instants it will write appends
// without copying the samples as the slices grow.
func (s *Store) Grow(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sr := range s.all {
		sr.ts = slices.Grow(sr.ts, n)
		if sr.nh != nil {
			sr.nh.pts = slices.Grow(sr.nh.pts, n)
		} else {
			sr.vs = slices.Grow(sr.vs, n)
		}
	}
}

// Labels returns the series' label set.
func (sr *Series) Labels() labels.Labels { return sr.lset }

// Len reports the number of samples in the series.
func (sr *Series) Len() int { return len(sr.ts) }

// Last returns the newest sample; ok is false when the series is empty. For
// a native histogram series v is the sample's count of observations.
func (sr *Series) Last() (tMs int64, v float64, ok bool) {
	n := len(sr.ts)
	if n == 0 {
		return 0, 0, false
	}
	if sr.nh != nil {
		return sr.ts[n-1], sr.nh.pts[n-1].count, true
	}
	return sr.ts[n-1], sr.vs[n-1], true
}

// Append adds the sample (tMs, v). Timestamps are milliseconds and must be
// non-decreasing per series: a sample at the same timestamp as the newest one
// replaces its value (the last write of a scrape instant wins), and an older
// timestamp makes Append panic, since it means the writer's clock went
// backwards. Append panics on a native histogram series (write it with its
// [NativeHistogram]).
func (sr *Series) Append(tMs int64, v float64) {
	if sr.nh != nil {
		panic(fmt.Sprintf("metrics: float sample appended to native histogram series %s", sr.lset))
	}
	n := len(sr.ts)
	if n > 0 {
		last := sr.ts[n-1]
		switch {
		case tMs == last:
			sr.vs[n-1] = v
			return
		case tMs < last:
			panic(fmt.Sprintf("metrics: out-of-order sample for %s: t=%d ms after t=%d ms", sr.lset, tMs, last))
		}
	}
	sr.ts = append(sr.ts, tMs)
	sr.vs = append(sr.vs, v)
}

// window returns the indexes [lo, hi) of the samples with mint <= t <= maxt.
func (sr *Series) window(mint, maxt int64) (lo, hi int) {
	lo = sort.Search(len(sr.ts), func(i int) bool { return sr.ts[i] >= mint })
	hi = lo + sort.Search(len(sr.ts)-lo, func(i int) bool { return sr.ts[lo+i] > maxt })
	return lo, hi
}

// Querier implements [storage.Queryable]. mint and maxt are inclusive bounds
// in milliseconds.
func (s *Store) Querier(mint, maxt int64) (storage.Querier, error) {
	return &querier{s: s, mint: mint, maxt: maxt}, nil
}

var _ storage.Queryable = (*Store)(nil)

// querier is a view of a Store limited to [mint, maxt].
type querier struct {
	s          *Store
	mint, maxt int64
}

// candidates returns the series that may match ms: those of the metric name
// when a matcher fixes it, else all. The caller holds s.mu.
func (q *querier) candidates(ms []*labels.Matcher) []*Series {
	for _, m := range ms {
		if m.Name == names.LabelName && m.Type == labels.MatchEqual {
			return q.s.byName[m.Value]
		}
	}
	return q.s.all
}

func matches(l labels.Labels, ms []*labels.Matcher) bool {
	for _, m := range ms {
		if !m.Matches(l.Get(m.Name)) {
			return false
		}
	}
	return true
}

// Select returns the series matching all matchers that have at least one
// sample in the querier's range, clipped to that range. Series come sorted by
// labels when sortSeries is set, else in creation order. Of the hints only
// Limit is used (when positive it caps the number of series), and for a
// native histogram series Step and Range: when both are 0 the selector is an
// instant vector selector of an instant query, which reads only the newest
// sample in [Start, End], so the view holds only that one (the engine walks
// every sample of the 5-minute lookback, and each histogram sample costs a
// rebuild). Otherwise the engine clips every selector to its own time range,
// so ignoring Start, End, Step and Range costs a little speed and never
// correctness.
func (q *querier) Select(_ context.Context, sortSeries bool, hints *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	limit := 0
	if hints != nil {
		limit = hints.Limit
	}
	q.s.mu.RLock()
	var out []*seriesView
	for _, sr := range q.candidates(ms) {
		if !matches(sr.lset, ms) {
			continue
		}
		lo, hi := sr.window(q.mint, q.maxt)
		if sr.nh != nil && hints != nil && hints.Step == 0 && hints.Range == 0 {
			lo, hi = sr.window(max(q.mint, hints.Start), min(q.maxt, hints.End))
			lo = max(lo, hi-1)
		}
		if lo == hi {
			continue
		}
		v := &seriesView{lset: sr.lset, ts: sr.ts[lo:hi:hi]}
		if sr.nh != nil {
			v.nh, v.pts = sr.nh, sr.nh.pts[lo:hi:hi]
		} else {
			v.vs = sr.vs[lo:hi:hi]
		}
		out = append(out, v)
	}
	q.s.mu.RUnlock()
	if sortSeries {
		slices.SortFunc(out, func(a, b *seriesView) int { return labels.Compare(a.lset, b.lset) })
	}
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return &seriesSet{list: out, i: -1}
}

// LabelValues returns the sorted distinct non-empty values of the label name
// among the series that match ms and have samples in the querier's range.
func (q *querier) LabelValues(_ context.Context, name string, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	seen := map[string]struct{}{}
	q.eachInRange(ms, func(l labels.Labels) {
		if v := l.Get(name); v != "" {
			seen[v] = struct{}{}
		}
	})
	return sortedKeys(seen, hints), nil, nil
}

// LabelNames returns the sorted distinct label names of the series that match
// ms and have samples in the querier's range.
func (q *querier) LabelNames(_ context.Context, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	seen := map[string]struct{}{}
	q.eachInRange(ms, func(l labels.Labels) {
		l.Range(func(lb labels.Label) { seen[lb.Name] = struct{}{} })
	})
	return sortedKeys(seen, hints), nil, nil
}

func (q *querier) eachInRange(ms []*labels.Matcher, f func(labels.Labels)) {
	q.s.mu.RLock()
	defer q.s.mu.RUnlock()
	for _, sr := range q.candidates(ms) {
		if !matches(sr.lset, ms) {
			continue
		}
		if lo, hi := sr.window(q.mint, q.maxt); lo < hi {
			f(sr.lset)
		}
	}
}

func sortedKeys(m map[string]struct{}, hints *storage.LabelHints) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	if hints != nil && hints.Limit > 0 && len(out) > hints.Limit {
		out = out[:hints.Limit]
	}
	return out
}

// Close releases nothing: the querier holds no resources.
func (q *querier) Close() error { return nil }

// seriesSet iterates over a fixed list of series views.
type seriesSet struct {
	list []*seriesView
	i    int
}

func (ss *seriesSet) Next() bool {
	if ss.i+1 >= len(ss.list) {
		ss.i = len(ss.list)
		return false
	}
	ss.i++
	return true
}
func (ss *seriesSet) At() storage.Series                { return ss.list[ss.i] }
func (ss *seriesSet) Err() error                        { return nil }
func (ss *seriesSet) Warnings() annotations.Annotations { return nil }

// seriesView is a series clipped to a time range; it implements storage.Series.
type seriesView struct {
	lset labels.Labels
	ts   []int64
	vs   []float64
	nh   *nativeData   // a native histogram series: then pts, not vs
	pts  []nativePoint // aligned with ts
}

func (v *seriesView) Labels() labels.Labels { return v.lset }

// Iterator returns an iterator over the view's samples, reusing it when it is
// one of this package's iterators.
func (v *seriesView) Iterator(it chunkenc.Iterator) chunkenc.Iterator {
	if v.nh != nil {
		hi, ok := it.(*histIterator)
		if !ok {
			hi = &histIterator{}
		}
		if hi.r.d != v.nh {
			hi.r.d = v.nh
			hi.r.st.reset()
		}
		hi.ts, hi.pts, hi.i = v.ts, v.pts, -1
		return hi
	}
	if fi, ok := it.(*floatIterator); ok {
		*fi = floatIterator{ts: v.ts, vs: v.vs, i: -1}
		return fi
	}
	return &floatIterator{ts: v.ts, vs: v.vs, i: -1}
}

// floatIterator iterates over float samples; i is -1 before the first Next
// and len(ts) once exhausted.
type floatIterator struct {
	ts []int64
	vs []float64
	i  int
}

func (it *floatIterator) Next() chunkenc.ValueType {
	if it.i+1 >= len(it.ts) {
		it.i = len(it.ts)
		return chunkenc.ValNone
	}
	it.i++
	return chunkenc.ValFloat
}

// millis is int64 under another name. It exists only so that go vet's
// stdmethods check does not mistake chunkenc.Iterator's Seek for io.Seeker's.
type millis = int64

func (it *floatIterator) Seek(t millis) chunkenc.ValueType {
	var ok bool
	if it.i, ok = seek(it.ts, it.i, t); !ok {
		return chunkenc.ValNone
	}
	return chunkenc.ValFloat
}

// seek moves index i of sample times ts (i < 0: before the first) forward
// to the first sample at or after t, never backwards, and reports whether
// there is one.
func seek(ts []int64, i int, t millis) (int, bool) {
	i = max(i, 0)
	if i < len(ts) && ts[i] < t {
		rest := ts[i:]
		i += sort.Search(len(rest), func(j int) bool { return rest[j] >= t })
	}
	return i, i < len(ts)
}

func (it *floatIterator) At() (int64, float64) { return it.ts[it.i], it.vs[it.i] }

func (it *floatIterator) AtHistogram(*histogram.Histogram) (int64, *histogram.Histogram) {
	panic("metrics: AtHistogram on a float series")
}

func (it *floatIterator) AtFloatHistogram(*histogram.FloatHistogram) (int64, *histogram.FloatHistogram) {
	panic("metrics: AtFloatHistogram on a float series")
}

func (it *floatIterator) AtT() int64  { return it.ts[it.i] }
func (it *floatIterator) AtST() int64 { return 0 }
func (it *floatIterator) Err() error  { return nil }

// histIterator iterates over the samples of a native histogram series as
// float histograms, rebuilding each one when it is read.
type histIterator struct {
	ts  []int64
	pts []nativePoint
	i   int
	r   nativeReader
}

func (it *histIterator) Next() chunkenc.ValueType {
	if it.i+1 >= len(it.ts) {
		it.i = len(it.ts)
		return chunkenc.ValNone
	}
	it.i++
	return chunkenc.ValFloatHistogram
}

func (it *histIterator) Seek(t millis) chunkenc.ValueType {
	var ok bool
	if it.i, ok = seek(it.ts, it.i, t); !ok {
		return chunkenc.ValNone
	}
	return chunkenc.ValFloatHistogram
}

func (it *histIterator) At() (int64, float64) {
	panic("metrics: At on a native histogram series")
}

func (it *histIterator) AtHistogram(*histogram.Histogram) (int64, *histogram.Histogram) {
	panic("metrics: AtHistogram on a float-histogram series")
}

// AtFloatHistogram rebuilds the current sample into fh (a new histogram
// when fh is nil): the caller owns the result.
func (it *histIterator) AtFloatHistogram(fh *histogram.FloatHistogram) (int64, *histogram.FloatHistogram) {
	return it.ts[it.i], it.r.at(it.pts[it.i], fh)
}

func (it *histIterator) AtT() int64  { return it.ts[it.i] }
func (it *histIterator) AtST() int64 { return 0 }
func (it *histIterator) Err() error  { return nil }
