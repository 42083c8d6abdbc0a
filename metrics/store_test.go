package metrics

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"

	"github.com/lm-warden/warden/metrics/names"
)

// sampleT is a test view of one sample.
type sampleT struct {
	T int64
	V float64
}

// testStore holds three series of "up" and one of "down", each with samples
// at t = 0, 10, ..., 90 ms, valued t/10 + an offset per series.
func testStore(t *testing.T) *Store {
	t.Helper()
	s := NewStore()
	sets := []labels.Labels{
		labels.FromStrings(names.LabelName, "up", "job", "a", "inst", "1"),
		labels.FromStrings(names.LabelName, "up", "job", "b", "inst", "2"),
		labels.FromStrings(names.LabelName, "up", "job", "a", "inst", "3"),
		labels.FromStrings(names.LabelName, "down", "job", "c"),
	}
	// Create in an order that is not label order, to test sorting.
	for i, l := range []labels.Labels{sets[1], sets[0], sets[2], sets[3]} {
		sr := s.Series(l)
		for ts := int64(0); ts < 100; ts += 10 {
			sr.Append(ts, float64(ts/10)+float64(100*i))
		}
	}
	return s
}

func selectAll(t *testing.T, q storage.Querier, sortSeries bool, hints *storage.SelectHints, ms ...*labels.Matcher) map[string][]sampleT {
	t.Helper()
	out := map[string][]sampleT{}
	var order []string
	ss := q.Select(context.Background(), sortSeries, hints, ms...)
	var it chunkenc.Iterator
	for ss.Next() {
		sr := ss.At()
		key := sr.Labels().String()
		order = append(order, key)
		it = sr.Iterator(it)
		for it.Next() == chunkenc.ValFloat {
			ts, v := it.At()
			out[key] = append(out[key], sampleT{ts, v})
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := ss.Err(); err != nil {
		t.Fatal(err)
	}
	if sortSeries && !slices.IsSorted(order) {
		t.Errorf("sortSeries: got order %v, want sorted", order)
	}
	return out
}

func TestSelect(t *testing.T) {
	m := labels.MustNewMatcher
	tests := []struct {
		name       string
		mint, maxt int64
		ms         []*labels.Matcher
		want       map[string][]int64 // series -> timestamps
	}{
		{
			name: "equal name, whole range", mint: 0, maxt: 1000,
			ms:   []*labels.Matcher{m(labels.MatchEqual, names.LabelName, "down")},
			want: map[string][]int64{`{__name__="down", job="c"}`: {0, 10, 20, 30, 40, 50, 60, 70, 80, 90}},
		},
		{
			name: "equal label, inclusive bounds", mint: 20, maxt: 40,
			ms: []*labels.Matcher{m(labels.MatchEqual, names.LabelName, "up"), m(labels.MatchEqual, "job", "a")},
			want: map[string][]int64{
				`{__name__="up", inst="1", job="a"}`: {20, 30, 40},
				`{__name__="up", inst="3", job="a"}`: {20, 30, 40},
			},
		},
		{
			name: "not equal", mint: 85, maxt: 95,
			ms:   []*labels.Matcher{m(labels.MatchEqual, names.LabelName, "up"), m(labels.MatchNotEqual, "job", "a")},
			want: map[string][]int64{`{__name__="up", inst="2", job="b"}`: {90}},
		},
		{
			name: "regexp without name matcher", mint: 0, maxt: 5,
			ms: []*labels.Matcher{m(labels.MatchRegexp, "job", "b|c")},
			want: map[string][]int64{
				`{__name__="up", inst="2", job="b"}`: {0},
				`{__name__="down", job="c"}`:         {0},
			},
		},
		{
			name: "not regexp on name", mint: 90, maxt: 90,
			ms:   []*labels.Matcher{m(labels.MatchNotRegexp, names.LabelName, "u.*")},
			want: map[string][]int64{`{__name__="down", job="c"}`: {90}},
		},
		{
			name: "matcher on a missing label matches empty", mint: 0, maxt: 0,
			ms:   []*labels.Matcher{m(labels.MatchEqual, "job", "")},
			want: map[string][]int64{},
		},
		{
			name: "range between samples is empty", mint: 11, maxt: 19,
			ms:   []*labels.Matcher{m(labels.MatchRegexp, names.LabelName, ".+")},
			want: map[string][]int64{},
		},
		{
			name: "range after the last sample is empty", mint: 91, maxt: 1000,
			ms:   []*labels.Matcher{m(labels.MatchRegexp, names.LabelName, ".+")},
			want: map[string][]int64{},
		},
		{
			name: "unknown name", mint: 0, maxt: 1000,
			ms:   []*labels.Matcher{m(labels.MatchEqual, names.LabelName, "nope")},
			want: map[string][]int64{},
		},
	}
	s := testStore(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, err := s.Querier(tt.mint, tt.maxt)
			if err != nil {
				t.Fatal(err)
			}
			defer q.Close()
			for _, sortSeries := range []bool{false, true} {
				got := map[string][]int64{}
				for k, ss := range selectAll(t, q, sortSeries, nil, tt.ms...) {
					for _, smp := range ss {
						got[k] = append(got[k], smp.T)
					}
				}
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("sort=%v: series and timestamps (-want +got):\n%s", sortSeries, diff)
				}
			}
		})
	}
}

func TestSelectValuesAndHints(t *testing.T) {
	s := testStore(t)
	q, _ := s.Querier(0, 30)
	// Hints with a narrower range must not lose data, Limit caps series.
	got := selectAll(t, q, true, &storage.SelectHints{Start: 25, End: 26, Limit: 2},
		labels.MustNewMatcher(labels.MatchEqual, names.LabelName, "up"))
	want := map[string][]sampleT{
		// sorted: inst="1" (created 2nd, offset 100), inst="2" (created 1st, offset 0)
		`{__name__="up", inst="1", job="a"}`: {{0, 100}, {10, 101}, {20, 102}, {30, 103}},
		`{__name__="up", inst="2", job="b"}`: {{0, 0}, {10, 1}, {20, 2}, {30, 3}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestSelectCreationOrderWhenUnsorted(t *testing.T) {
	s := testStore(t)
	q, _ := s.Querier(0, 0)
	ss := q.Select(context.Background(), false, nil, labels.MustNewMatcher(labels.MatchEqual, names.LabelName, "up"))
	var got []string
	for ss.Next() {
		got = append(got, ss.At().Labels().Get("inst"))
	}
	if want := []string{"2", "1", "3"}; !slices.Equal(got, want) {
		t.Errorf("unsorted order = %v, want creation order %v", got, want)
	}
}

func TestIteratorSeek(t *testing.T) {
	s := NewStore()
	sr := s.Series(labels.FromStrings(names.LabelName, "x"))
	for ts := int64(0); ts <= 50; ts += 10 {
		sr.Append(ts, float64(ts))
	}
	q, _ := s.Querier(0, 100)
	ss := q.Select(context.Background(), false, nil, labels.MustNewMatcher(labels.MatchEqual, names.LabelName, "x"))
	if !ss.Next() {
		t.Fatal("no series")
	}
	view := ss.At()
	tests := []struct {
		name  string
		steps func(it chunkenc.Iterator) (chunkenc.ValueType, int64)
		wantT int64
		wantV chunkenc.ValueType
	}{
		{"seek before start", func(it chunkenc.Iterator) (chunkenc.ValueType, int64) { return it.Seek(-5), it.AtT() }, 0, chunkenc.ValFloat},
		{"seek between", func(it chunkenc.Iterator) (chunkenc.ValueType, int64) { return it.Seek(21), it.AtT() }, 30, chunkenc.ValFloat},
		{"seek exact", func(it chunkenc.Iterator) (chunkenc.ValueType, int64) { return it.Seek(40), it.AtT() }, 40, chunkenc.ValFloat},
		{"seek does not go back", func(it chunkenc.Iterator) (chunkenc.ValueType, int64) {
			it.Seek(40)
			return it.Seek(10), it.AtT()
		}, 40, chunkenc.ValFloat},
		{"next after seek", func(it chunkenc.Iterator) (chunkenc.ValueType, int64) {
			it.Seek(40)
			return it.Next(), it.AtT()
		}, 50, chunkenc.ValFloat},
		{"seek past end", func(it chunkenc.Iterator) (chunkenc.ValueType, int64) { return it.Seek(51), -1 }, -1, chunkenc.ValNone},
	}
	var it chunkenc.Iterator
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			it = view.Iterator(it) // reuse across cases
			vt, ts := tt.steps(it)
			if vt != tt.wantV || ts != tt.wantT {
				t.Errorf("got (%v, t=%d), want (%v, t=%d)", vt, ts, tt.wantV, tt.wantT)
			}
		})
	}
	it = view.Iterator(it)
	n := 0
	for it.Next() != chunkenc.ValNone {
		n++
	}
	if n != 6 || it.Next() != chunkenc.ValNone || it.Seek(0) != chunkenc.ValNone {
		t.Errorf("exhausted iterator: %d samples, then Next/Seek must stay ValNone", n)
	}
}

func TestLabelValuesAndNames(t *testing.T) {
	s := testStore(t)
	s.Series(labels.FromStrings(names.LabelName, "empty", "job", "z")) // no samples: invisible
	m := labels.MustNewMatcher
	tests := []struct {
		name       string
		label      string
		mint, maxt int64
		hints      *storage.LabelHints
		ms         []*labels.Matcher
		wantValues []string
		wantNames  []string
	}{
		{name: "all", label: "job", mint: 0, maxt: 100,
			wantValues: []string{"a", "b", "c"}, wantNames: []string{names.LabelName, "inst", "job"}},
		{name: "matcher", label: "inst", mint: 0, maxt: 100, ms: []*labels.Matcher{m(labels.MatchEqual, "job", "a")},
			wantValues: []string{"1", "3"}, wantNames: []string{names.LabelName, "inst", "job"}},
		{name: "name matcher", label: "job", mint: 0, maxt: 100, ms: []*labels.Matcher{m(labels.MatchEqual, names.LabelName, "down")},
			wantValues: []string{"c"}, wantNames: []string{names.LabelName, "job"}},
		{name: "limit", label: "job", mint: 0, maxt: 100, hints: &storage.LabelHints{Limit: 1},
			wantValues: []string{"a"}, wantNames: []string{names.LabelName}},
		{name: "out of range", label: "job", mint: 200, maxt: 300,
			wantValues: []string{}, wantNames: []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, _ := s.Querier(tt.mint, tt.maxt)
			vals, _, err := q.LabelValues(context.Background(), tt.label, tt.hints, tt.ms...)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.wantValues, vals); diff != "" {
				t.Errorf("LabelValues (-want +got):\n%s", diff)
			}
			names, _, err := q.LabelNames(context.Background(), tt.hints, tt.ms...)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.wantNames, names); diff != "" {
				t.Errorf("LabelNames (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSeriesGetOrCreate(t *testing.T) {
	s := NewStore()
	a := s.Series(labels.FromStrings(names.LabelName, "x", "k", "v"))
	b := s.Series(labels.FromStrings("k", "v", names.LabelName, "x")) // same set, other order
	c := s.Series(labels.FromStrings(names.LabelName, "x", "k", "w"))
	if a != b {
		t.Error("same label set gave two series")
	}
	if a == c || s.Len() != 2 {
		t.Errorf("distinct label sets: a==c %v, Len %d, want false, 2", a == c, s.Len())
	}
}

func TestHashCollisionKeepsSeriesApart(t *testing.T) {
	// Force a collision by planting a foreign series under a's hash.
	s := NewStore()
	la := labels.FromStrings(names.LabelName, "a")
	lb := labels.FromStrings(names.LabelName, "b")
	fake := &Series{lset: lb}
	s.byHash[la.Hash()] = []*Series{fake}
	if got := s.Series(la); got == fake || !labels.Equal(got.Labels(), la) {
		t.Errorf("Series(%s) returned the colliding series %s", la, got.Labels())
	}
	if n := len(s.byHash[la.Hash()]); n != 2 {
		t.Errorf("bucket holds %d series, want 2", n)
	}
}

func TestAppend(t *testing.T) {
	s := NewStore()
	sr := s.Series(labels.FromStrings(names.LabelName, "x"))
	if _, _, ok := sr.Last(); ok {
		t.Error("Last on empty series: ok")
	}
	sr.Append(1000, 1)
	sr.Append(1000, 2) // same instant: replaces
	sr.Append(2000, math.NaN())
	sr.Append(3000, 4)
	if sr.Len() != 3 {
		t.Errorf("Len = %d, want 3", sr.Len())
	}
	if ts, v, _ := sr.Last(); ts != 3000 || v != 4 {
		t.Errorf("Last = (%d, %v), want (3000, 4)", ts, v)
	}
	if sr.vs[0] != 2 {
		t.Errorf("value at t=1000 is %v, want the replacement 2", sr.vs[0])
	}
	defer func() {
		if recover() == nil {
			t.Error("out-of-order Append did not panic")
		}
	}()
	sr.Append(2999, 5)
}

func TestSeriesWithoutNamePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Series without __name__ did not panic")
		}
	}()
	NewStore().Series(labels.FromStrings("job", "a"))
}

// TestStoreGrow checks that Grow keeps every sample and leaves room for n
// more in float and native histogram series alike.
func TestStoreGrow(t *testing.T) {
	s := NewStore()
	f := s.Series(labels.FromStrings(names.LabelName, "a"))
	h := NewNativeHistogram(s, "h", labels.EmptyLabels(), names.WardenTTFBNative())
	f.Append(1, 5)
	h.Observe(0.5)
	h.Append(1)
	s.Grow(100)
	if f.Len() != 1 || cap(f.ts)-len(f.ts) < 100 || cap(f.vs)-len(f.vs) < 100 {
		t.Fatalf("float series: %d samples, room for %d/%d", f.Len(), cap(f.ts)-len(f.ts), cap(f.vs)-len(f.vs))
	}
	nh := s.Series(labels.FromStrings(names.LabelName, "h"))
	if nh.Len() != 1 || cap(nh.nh.pts)-len(nh.nh.pts) < 100 {
		t.Fatalf("native series: %d samples, room for %d", nh.Len(), cap(nh.nh.pts)-len(nh.nh.pts))
	}
	if tm, v, ok := f.Last(); !ok || tm != 1 || v != 5 {
		t.Fatalf("float sample after Grow: %d %v %v", tm, v, ok)
	}
	if tm, v, ok := nh.Last(); !ok || tm != 1 || v != 1 {
		t.Fatalf("native sample after Grow: %d %v %v", tm, v, ok)
	}
}
