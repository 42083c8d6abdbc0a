package sim

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/lm-warden/warden/metrics"
	"github.com/lm-warden/warden/metrics/names"
)

// TestRecorderWritesNativeTTFB checks that the recorder writes
// warden_ttfb_seconds twice, as live mode's client_golang histogram
// exposes it: classic buckets and a native histogram holding the same
// observations at every scrape instant.
func TestRecorderWritesNativeTTFB(t *testing.T) {
	var mu sync.Mutex
	stores := map[string]*metrics.Store{}
	_, err := Run(context.Background(), Experiment{
		Farm: mustDefaultFarm(t), Sessions: []int{8}, Duration: time.Minute, Seed: 2,
		OnStore: func(s string, st *metrics.Store) { mu.Lock(); stores[s] = st; mu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(stores) == 0 {
		t.Fatal("no store")
	}
	ev := metrics.NewEvaluator()
	for s, st := range stores {
		// At every scrape instant, the native count equals the classic one.
		m, err := ev.Range(context.Background(), st,
			`histogram_count(sum(warden_ttfb_seconds)) - sum(warden_ttfb_seconds_count)`,
			time.UnixMilli(0), time.UnixMilli(60_000), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if len(m) != 1 || len(m[0].Floats) != 61 {
			t.Fatalf("%s: %v, want one series of 61 points", s, m)
		}
		for _, p := range m[0].Floats {
			if p.F != 0 {
				t.Fatalf("%s: native minus classic count %v at %d ms", s, p.F, p.T)
			}
		}
		v, err := ev.Instant(context.Background(), st, `sum(warden_ttfb_seconds)`, time.UnixMilli(60_000))
		if err != nil {
			t.Fatal(err)
		}
		if len(v) != 1 || v[0].H == nil || v[0].H.Count == 0 || v[0].H.Schema != names.WardenTTFBNative().Schema() {
			t.Fatalf("%s: native histogram at the end: %v", s, v)
		}
	}
}
