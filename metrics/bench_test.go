package metrics

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"

	"github.com/lm-warden/warden/metrics/names"
)

// BenchmarkAppend measures one sample appended to an existing series.
func BenchmarkAppend(b *testing.B) {
	sr := NewStore().Series(labels.FromStrings(names.LabelName, "x", "k", "v"))
	b.ReportAllocs()
	t := int64(0)
	for b.Loop() {
		t += 1000
		sr.Append(t, float64(t))
	}
}

// BenchmarkHistogramAppend measures one scrape of warden's TTFB histogram.
func BenchmarkHistogramAppend(b *testing.B) {
	h := NewHistogram(NewStore(), names.WardenTTFB, labels.FromStrings(names.LabelModel, "m"), names.WardenTTFBBuckets())
	b.ReportAllocs()
	t := int64(0)
	for b.Loop() {
		t += 1000
		h.Observe(0.3)
		h.Append(t)
	}
}

// BenchmarkNativeHistogramAppend measures one scrape of warden's TTFB
// histogram with its native histogram, as the simulator writes it.
func BenchmarkNativeHistogramAppend(b *testing.B) {
	st := NewStore()
	h := NewHistogram(st, names.WardenTTFB, labels.FromStrings(names.LabelModel, "m"), names.WardenTTFBBuckets()).WithNative(st, names.WardenTTFBNative())
	b.ReportAllocs()
	t := int64(0)
	v := 0.3
	for b.Loop() {
		t += 1000
		v = v*1.37 + 0.01
		if v > 60 {
			v -= 59.9
		}
		h.Observe(v)
		h.Append(t)
	}
}

// BenchmarkKPIValues evaluates every KPI over the last 3 minutes of a farm of
// 4 engines scraped every second for 30 minutes.
func BenchmarkKPIValues(b *testing.B) {
	const engines, seconds = 4, 1800
	st, _ := newFarm(b, engines, seconds)
	ev := NewEvaluator()
	end := time.UnixMilli(seconds * 1000)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ev.KPIValues(context.Background(), st, farmModel, end, 3*time.Minute); err != nil {
			b.Fatal(err)
		}
	}
}
