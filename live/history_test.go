package live

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/lm-warden/warden/internal/fakevllm"
)

// histModel is a model of n replicas in the URL layout, for history.report.
func histModel(t *testing.T, n int) (*model, []string) {
	t.Helper()
	m := &model{cfg: ModelCfg{Name: "m"}}
	var keys []string
	for i := range n {
		u, err := url.Parse(fmt.Sprintf("http://10.0.0.%d:8000", i+1))
		if err != nil {
			t.Fatal(err)
		}
		m.replicas = append(m.replicas, &replica{id: i, target: u, engine: -1})
		keys = append(keys, u.String())
	}
	m.hist = newHistory(keys)
	return m, keys
}

func counters(prompt, hits, gen float64) EngineStats {
	return EngineStats{PromptTokens: prompt, PrefixQueries: prompt, PrefixHits: hits, GenerationTokens: gen}
}

// everyPointNonNegative fails when any point of s is negative.
func everyPointNonNegative(t *testing.T, what string, s HistorySeries) {
	t.Helper()
	for name, xs := range map[string][]*float64{"prompt": s.PromptTPS, "cached": s.CachedTPS, "computed": s.ComputedTPS, "generation": s.GenerationTPS, "hit": s.HitPct} {
		for i, v := range xs {
			if v != nil && (*v < 0 || math.IsNaN(*v)) {
				t.Errorf("%s: %s point %d is %v", what, name, i, *v)
			}
		}
	}
	if s.Total.PromptTokens < 0 || s.Total.CachedTokens < 0 || s.Total.ComputedTokens < 0 || (s.Total.GenerationTokens != nil && *s.Total.GenerationTokens < 0) {
		t.Errorf("%s: negative totals %+v", what, s.Total)
	}
}

// TestHistoryCounterReset feeds one replica's counters, scraped every
// second, through restarts of its server (counters back to a lower value)
// and checks that every rate stays >= 0 and that the totals count, after a
// restart, what the new server counted since it started (as PromQL's
// increase() does).
func TestHistoryCounterReset(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		name      string
		seq       []EngineStats // one per second from t0
		wantTotal tokenCounts   // prompt, queries, hits, gen over the hour
	}{
		{"steady", []EngineStats{counters(0, 0, 0), counters(1000, 800, 10), counters(2000, 1600, 20)},
			tokenCounts{2000, 2000, 1600, 20}},
		{"restart to zero", []EngineStats{counters(5000, 4000, 50), counters(6000, 4800, 60), counters(0, 0, 0), counters(300, 100, 3)},
			tokenCounts{1300, 1300, 900, 13}},
		{"restart and already counting", []EngineStats{counters(5000, 4000, 50), counters(700, 200, 7), counters(1700, 1000, 17)},
			tokenCounts{1700, 1700, 1000, 17}},
		{"only one counter went back", []EngineStats{counters(5000, 4000, 50), counters(6000, 100, 60)},
			tokenCounts{6000, 6000, 100, 60}},
		{"first scrape is the baseline", []EngineStats{counters(1e9, 9e8, 1e7), counters(1e9+10, 9e8+5, 1e7+1)},
			tokenCounts{10, 10, 5, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, keys := histModel(t, 1)
			for i, e := range tt.seq {
				m.hist.observe(keys[0], e, t0.Add(time.Duration(i)*time.Second))
			}
			rep := m.hist.report(m, t0.Add(time.Duration(len(tt.seq))*time.Second))
			everyPointNonNegative(t, "model", rep.HistorySeries)
			everyPointNonNegative(t, "replica", rep.Replicas[0].HistorySeries)
			got := rep.Total
			if got.PromptTokens != tt.wantTotal.Prompt || got.QueriedTokens != tt.wantTotal.Queries ||
				got.CachedTokens != tt.wantTotal.Hits || got.GenerationTokens == nil || *got.GenerationTokens != tt.wantTotal.Gen {
				t.Errorf("totals %+v (gen %v), want %+v", got, deref(got.GenerationTokens), tt.wantTotal)
			}
		})
	}
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

// TestHistoryBounded runs three hours of scrapes every 2 s through the ring
// and checks it stays at historyPoints points per series, holds the last
// hour only, and allocates nothing per observation.
func TestHistoryBounded(t *testing.T) {
	m, keys := histModel(t, 2)
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	var now time.Time
	step := 2 * time.Second
	for i := range int(3 * time.Hour / step) {
		now = t0.Add(time.Duration(i) * step)
		for r, k := range keys {
			v := float64(i) * 100 * float64(r+1) // replica 0: 50 tokens/s, replica 1: 100
			m.hist.observe(k, counters(v, v/2, v/10), now)
		}
	}
	for _, r := range m.hist.allRows() {
		if len(r.buckets) != historyPoints || cap(r.buckets) != historyPoints {
			t.Errorf("row %s: %d buckets (cap %d), want %d", r.key, len(r.buckets), cap(r.buckets), historyPoints)
		}
	}
	rep := m.hist.report(m, now)
	if n := len(rep.PromptTPS); n != historyPoints {
		t.Fatalf("%d points, want %d", n, historyPoints)
	}
	hour := historyInterval * historyPoints
	if start := time.UnixMilli(rep.StartMs); now.Sub(start) > hour {
		t.Errorf("first point starts %s before the last observation, want at most %s", now.Sub(start), hour)
	}
	// Within the last hour only: 150 tokens/s for at most an hour.
	if got, most := rep.Total.PromptTokens, 150*hour.Seconds(); got > most || got < 0.99*most {
		t.Errorf("prompt tokens over the ring %.0f, want the last hour's, about %.0f", got, most)
	}
	if got := *rep.PromptTPS[historyPoints-2]; got != 150 {
		t.Errorf("a full point's prompt rate %v tokens/s, want 150", got)
	}
	if got := *rep.Replicas[1].CachedTPS[historyPoints-2]; got != 50 {
		t.Errorf("replica 1 cached rate %v tokens/s, want 50", got)
	}
	// 2 s into a new point: too early for its rates, but its tokens count.
	before := rep.Total.PromptTokens
	now = now.Add(4 * time.Second) // t0 + 3h + 2s
	for r, k := range keys {
		v := float64(int(3*time.Hour/step)+1) * 100 * float64(r+1)
		m.hist.observe(k, counters(v, v/2, v/10), now)
	}
	rep = m.hist.report(m, now)
	if last := rep.PromptTPS[historyPoints-1]; last != nil {
		t.Errorf("a point 2 s old has a rate (%v tokens/s), want null until half of it passed", *last)
	}
	if prev := rep.PromptTPS[historyPoints-2]; prev == nil || *prev != 150 {
		t.Errorf("the point before: %v tokens/s, want 150", deref(prev))
	}
	if rep.Total.PromptTokens <= before-150*historyInterval.Seconds() {
		t.Errorf("totals %v after %v: the new point's tokens are not counted", rep.Total.PromptTokens, before)
	}
	allocs := testing.AllocsPerRun(100, func() {
		now = now.Add(step)
		m.hist.observe(keys[0], counters(1e9, 1e8, 1e7), now)
	})
	if allocs != 0 {
		t.Errorf("observe allocates %.1f times, want 0", allocs)
	}
}

// TestHistoryConcurrent feeds the ring from one goroutine per replica (the
// scrape loops of the URL layout) while others read it and a reload adopts
// it; run with -race.
func TestHistoryConcurrent(t *testing.T) {
	m, keys := histModel(t, 4)
	t0 := time.Now()
	var wg sync.WaitGroup
	for r, k := range keys {
		wg.Go(func() {
			for i := range 2000 {
				v := float64(i * (r + 1))
				m.hist.observe(k, counters(v, v/2, v/4), t0.Add(time.Duration(i)*50*time.Millisecond))
			}
		})
	}
	for range 2 {
		wg.Go(func() {
			for range 200 {
				rep := m.hist.report(m, time.Now())
				if len(rep.Replicas) != 4 {
					t.Errorf("%d replicas", len(rep.Replicas))
					return
				}
			}
		})
	}
	wg.Go(func() {
		for range 50 {
			n, _ := histModel(t, 3)
			n.hist.adopt(m.hist)
		}
	})
	wg.Wait()
	rep := m.hist.report(m, t0.Add(100*time.Second))
	// 1999 steps of 1+2+3+4 tokens each, all within the last hour.
	if want := float64(1999 * 10); rep.Total.PromptTokens != want {
		t.Errorf("prompt tokens %v, want %v", rep.Total.PromptTokens, want)
	}
}

// TestHistoryAdopt checks that a reload that changes the replica list keeps
// the hour: a replica that stays keeps its row and its last counters (no
// gap, no spike), one that went still counts in the model's totals.
func TestHistoryAdopt(t *testing.T) {
	old, keys := histModel(t, 2)
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for i := range 31 {
		for _, k := range keys {
			old.hist.observe(k, counters(float64(100*i), float64(50*i), float64(i)), t0.Add(time.Duration(i)*time.Second))
		}
	}
	next, nkeys := histModel(t, 1) // keeps replica 0 (same URL), drops replica 1
	if nkeys[0] != keys[0] {
		t.Fatal("test setup: the kept replica changed its key")
	}
	next.hist.adopt(old.hist)
	next.hist.observe(nkeys[0], counters(3100, 1550, 31), t0.Add(31*time.Second))
	rep := next.hist.report(next, t0.Add(32*time.Second))
	if got, want := rep.Replicas[0].Total.PromptTokens, 3100.0; got != want {
		t.Errorf("kept replica: %v prompt tokens, want %v", got, want)
	}
	if got, want := rep.Total.PromptTokens, 3100.0+3000; got != want {
		t.Errorf("model: %v prompt tokens, want %v (the removed replica's hour included)", got, want)
	}
}

// TestHistoryEndpoint runs a proxy in front of two fake vLLM servers whose
// counters grow with every request and checks GET /api/history: the hour's
// totals are what the servers counted, per replica and summed, the rates
// are there at once, and a restarted server (counters back to zero) makes
// no negative rate.
func TestHistoryEndpoint(t *testing.T) {
	start := time.Now()
	a, b := fakevllm.New(t, 1), fakevllm.New(t, 1)
	h := startProxy(t, modelsYAML("trusted_pin_header: X-Warden-Replica\n", urlsModel(a.URL(), b.URL())))
	h.scraped() // the first scrapes are the baselines: nothing counted yet
	pinned := func(s string, replica int) map[string]string {
		return map[string]string{"X-Claude-Code-Session-Id": s, "X-Warden-Replica": fmt.Sprint(replica)}
	}
	get := func(query string) (int, HistoryReport) {
		t.Helper()
		res, err := h.client.Get(h.admin + "/api/history" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var rep HistoryReport
		if res.StatusCode == http.StatusOK {
			if err := json.NewDecoder(res.Body).Decode(&rep); err != nil {
				t.Fatal(err)
			}
		}
		return res.StatusCode, rep
	}
	for s := range 6 {
		for turn := range 3 {
			h.do("POST", "/v1/chat/completions", chatBody(testModel, fmt.Sprint("s", s), turn, s%2 == 0), pinned(fmt.Sprint("s", s), s%2))
		}
	}
	fakes := []*fakevllm.Server{a, b}
	var want [2][4]float64
	for i, f := range fakes {
		c := f.Counters()
		want[i] = [4]float64{c.Prompt, c.Queries, c.Hits, c.Gen}
	}
	// A scrape after the last request carries the final counters.
	var rep HistoryReport
	deadline := time.Now().Add(10 * time.Second)
	for {
		var code int
		code, rep = get("?model=" + testModel)
		if code != http.StatusOK || len(rep.Models) != 1 {
			t.Fatalf("GET /api/history?model=%s: %d, %d models", testModel, code, len(rep.Models))
		}
		// Seconds is rounded to 0.1 s: a fast run may have counted the
		// tokens before the scrapes span 0.05 s.
		if rep.Models[0].Total.PromptTokens == math.Round(want[0][0]+want[1][0]) && rep.Models[0].Total.Seconds > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("history prompt tokens %v, want %v", rep.Models[0].Total.PromptTokens, want[0][0]+want[1][0])
		}
		time.Sleep(20 * time.Millisecond)
	}
	mh := rep.Models[0]
	if rep.Points != historyPoints || rep.IntervalSec != historyInterval.Seconds() || len(mh.PromptTPS) != historyPoints || len(mh.Replicas) != 2 {
		t.Fatalf("shape: %d points of %v s, %d prompt points, %d replicas", rep.Points, rep.IntervalSec, len(mh.PromptTPS), len(mh.Replicas))
	}
	for i, r := range mh.Replicas {
		tot := r.Total
		if tot.PromptTokens != want[i][0] || tot.QueriedTokens != want[i][1] || tot.CachedTokens != want[i][2] || deref(tot.GenerationTokens) != want[i][3] {
			t.Errorf("replica %d totals %+v (gen %v), want prompt %v, queries %v, hits %v, gen %v",
				i, tot, deref(tot.GenerationTokens), want[i][0], want[i][1], want[i][2], want[i][3])
		}
		if want[i][2] == 0 {
			t.Errorf("replica %d: fake counted no cache hit; the test sends later turns to warm caches", i)
		}
		if tot.HitPct == nil || math.Abs(*tot.HitPct-100*want[i][2]/want[i][1]) > 0.05 {
			t.Errorf("replica %d hit %% %v, want %.1f", i, deref(tot.HitPct), 100*want[i][2]/want[i][1])
		}
	}
	// Which points have rates depends on where the wall clock stands in
	// the 10 s points (a point needs half of it scraped): the unit tests
	// above hold that; here, the hour is covered since the first scrape.
	if mh.Total.Seconds <= 0 || mh.Total.Seconds > time.Since(start).Seconds()+1 {
		t.Errorf("the hour covers %v s, want (0, %v]", mh.Total.Seconds, time.Since(start).Seconds())
	}
	if code, _ := get("?model=nope"); code != http.StatusNotFound {
		t.Errorf("GET /api/history?model=nope: %d, want 404", code)
	}
	if code, all := get(""); code != http.StatusOK || len(all.Models) != 1 {
		t.Errorf("GET /api/history: %d, %d models", code, len(all.Models))
	}

	// Server a restarts: counters back to zero, then counting again.
	a.Restart()
	seq := func(st StatusReport) bool {
		return st.Models[0].Replicas[0].PrefixQueries != nil && *st.Models[0].Replicas[0].PrefixQueries == 0
	}
	h.waitFor("the restarted server scraped", seq)
	h.do("POST", "/v1/chat/completions", chatBody(testModel, "s0", 3, false), pinned("s0", 0))
	after := a.Counters().Prompt
	if after == 0 {
		t.Fatal("the restarted server counted nothing")
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		_, rep = get("?model=" + testModel)
		if rep.Models[0].Replicas[0].Total.PromptTokens == want[0][0]+after {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a restart replica 0 counted %v prompt tokens, want %v + %v", rep.Models[0].Replicas[0].Total.PromptTokens, want[0][0], after)
		}
		time.Sleep(20 * time.Millisecond)
	}
	everyPointNonNegative(t, "model after restart", rep.Models[0].HistorySeries)
	everyPointNonNegative(t, "replica 0 after restart", rep.Models[0].Replicas[0].HistorySeries)
}

// TestHistoryKeptOnReload checks that a reload that rebuilds a model (here:
// a replica added) keeps the hour of token rates the stats page draws.
func TestHistoryKeptOnReload(t *testing.T) {
	a, b := fakevllm.New(t, 1), fakevllm.New(t, 1)
	h := startProxy(t, modelsYAML("", urlsModel(a.URL())))
	h.scraped()
	h.do("POST", "/v1/chat/completions", chatBody(testModel, "a", 0, false), sessionHdr("a"))
	p := a.Counters().Prompt
	waitPrompt := func(want float64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			rep, _ := h.srv.History(testModel)
			if got := rep.Models[0].Total.PromptTokens; got == want {
				return
			} else if time.Now().After(deadline) {
				t.Fatalf("history prompt tokens %v, want %v", got, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitPrompt(p)
	cfg, err := ParseConfig("r.yaml", []byte("listen: 127.0.0.1:0\n"+modelsYAML("", urlsModel(a.URL(), b.URL()))))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.srv.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if rep, _ := h.srv.History(testModel); rep.Models[0].Total.PromptTokens != p || len(rep.Models[0].Replicas) != 2 {
		t.Fatalf("after reload: %v prompt tokens on %d replicas, want %v on 2", rep.Models[0].Total.PromptTokens, len(rep.Models[0].Replicas), p)
	}
	h.do("POST", "/v1/chat/completions", chatBody(testModel, "a", 1, false), sessionHdr("a"))
	pa := a.Counters().Prompt
	pb := b.Counters().Prompt
	waitPrompt(pa + pb)
}

// TestHistoryReportGolden holds the JSON of a short ring (12 points of
// 10 s) against testdata/history.golden.json (go test -run
// TestHistoryReportGolden -update rewrites it): two replicas scraped every
// 3 s, one that restarts halfway and one whose scrapes fail for 20 s (its
// increase spread over the gap), and a server that exposes neither
// prompt_tokens_total nor generation_tokens_total (queries stand in).
func TestHistoryReportGolden(t *testing.T) {
	m, keys := histModel(t, 3)
	m.hist = newHistorySized(keys, 10*time.Second, 12)
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for i := range 40 {
		at := t0.Add(time.Duration(3*i) * time.Second)
		v := float64(300 * i)
		if i >= 20 {
			v = float64(300 * (i - 20)) // replica 0 restarted
		}
		m.hist.observe(keys[0], counters(v, v*0.75, v/30), at)
		if i < 25 || i > 31 { // replica 1's scrapes fail from 75 s to 93 s
			w := float64(600 * i)
			m.hist.observe(keys[1], counters(w, w/2, w/60), at)
		}
		q := float64(100 * i)
		m.hist.observe(keys[2], EngineStats{PrefixQueries: q, PrefixHits: q / 4}, at)
	}
	rep := m.hist.report(m, t0.Add(118*time.Second))
	got, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	path := filepath.Join("testdata", "history.golden.json")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("history JSON differs from %s (run with -update after checking):\n%s", path, got)
	}
	everyPointNonNegative(t, "model", rep.HistorySeries)
	for _, r := range rep.Replicas {
		everyPointNonNegative(t, fmt.Sprint("replica ", r.ID), r.HistorySeries)
	}
}

// fullRing is a model of n replicas with an hour of scrapes every second.
func fullRing(b *testing.B, n int) (*model, []string, time.Time) {
	m := &model{cfg: ModelCfg{Name: "m"}}
	var keys []string
	for i := range n {
		u, _ := url.Parse(fmt.Sprintf("http://10.0.0.%d:8000", i+1))
		m.replicas = append(m.replicas, &replica{id: i, target: u, engine: -1})
		keys = append(keys, u.String())
	}
	m.hist = newHistory(keys)
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	now := t0
	for i := range 3600 {
		now = t0.Add(time.Duration(i) * time.Second)
		for _, k := range keys {
			v := float64(i) * 1000
			m.hist.observe(k, counters(v, v*0.7, v/20), now)
		}
	}
	return m, keys, now
}

// BenchmarkHistoryObserve is one replica's scrape added to the ring.
func BenchmarkHistoryObserve(b *testing.B) {
	m, keys, now := fullRing(b, 16)
	i := 3600
	for b.Loop() {
		now = now.Add(time.Second)
		i++
		v := float64(i) * 1000
		m.hist.observe(keys[i%16], counters(v, v*0.7, v/20), now)
	}
}

// BenchmarkHistoryServe is GET /api/history's work for a model of 16
// replicas with a full hour: the series and their JSON.
func BenchmarkHistoryServe(b *testing.B) {
	m, _, now := fullRing(b, 16)
	var size int
	for b.Loop() {
		rep := m.hist.report(m, now)
		buf, err := json.Marshal(rep)
		if err != nil {
			b.Fatal(err)
		}
		size = len(buf)
	}
	b.ReportMetric(float64(size), "bytes/op-json")
}

// TestHistoryScrapeGap checks the points of a replica whose scrapes fail:
// while they fail its points are null (unknown), not a rate over the
// moment a last scrape happened to cover; the next good scrape spreads the
// increase over the gap, so the points get their mean rate.
func TestHistoryScrapeGap(t *testing.T) {
	m, keys := histModel(t, 1)
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for i := 0; i <= 20; i++ {
		m.hist.observe(keys[0], counters(float64(100*i), 0, 0), t0.Add(time.Duration(i)*time.Second))
	}
	// One more scrape 50 ms into the next point, which saw no new token
	// (vLLM counts at the end of a step), then the server is down.
	m.hist.observe(keys[0], counters(2000, 0, 0), t0.Add(20*time.Second+50*time.Millisecond))
	pts := func(now time.Time) []any {
		rep := m.hist.report(m, now)
		var out []any
		for _, v := range rep.PromptTPS[historyPoints-4:] {
			out = append(out, deref(v))
		}
		return out
	}
	// Points 0-10 s, 10-20 s, 20-30 s, 30-40 s (in progress, 8 s in).
	if got := fmt.Sprint(pts(t0.Add(38 * time.Second))); got != "[100 100 <nil> <nil>]" {
		t.Errorf("while scrapes fail: prompt tokens/s %s, want [100 100 <nil> <nil>]", got)
	}
	// 1800 tokens over the 18 s of the gap: 100 tokens/s, of which 9.95 s
	// in the point 20-30 s (99.5 tokens/s over it).
	m.hist.observe(keys[0], counters(3800, 0, 0), t0.Add(38*time.Second+50*time.Millisecond))
	if got := fmt.Sprint(pts(t0.Add(39 * time.Second))); got != "[100 100 99.5 100]" {
		t.Errorf("after the next good scrape: prompt tokens/s %s, want [100 100 99.5 100]", got)
	}
}

// TestHistoryDataParallel checks the data-parallel layout: one server, one
// row per engine (rank), each with its own engine's counters.
func TestHistoryDataParallel(t *testing.T) {
	f := fakevllm.New(t, 2)
	h := startProxy(t, modelsYAML("", "  - name: "+testModel+"\n    url: "+f.URL()+"\n    data_parallel_size: 2\n"))
	h.scraped()
	for s := range 4 {
		h.do("POST", "/v1/chat/completions", chatBody(testModel, fmt.Sprint("s", s), 0, false), sessionHdr(fmt.Sprint("s", s)))
	}
	var want []float64
	for _, c := range f.PerEngine() {
		want = append(want, c.Prompt)
	}
	if want[0] == 0 || want[1] == 0 {
		t.Fatalf("prompt tokens per engine %v: the test wants both engines used", want)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		rep, _ := h.srv.History(testModel)
		mh := rep.Models[0]
		if len(mh.Replicas) != 2 {
			t.Fatalf("%d replicas, want 2", len(mh.Replicas))
		}
		got := []float64{mh.Replicas[0].Total.PromptTokens, mh.Replicas[1].Total.PromptTokens}
		if got[0] == want[0] && got[1] == want[1] && mh.Total.PromptTokens == want[0]+want[1] {
			if r := mh.Replicas[1].Rank; r == nil || *r != 1 {
				t.Errorf("replica 1 rank %v, want 1", deref2(r))
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("prompt tokens per rank %v (model %v), want %v", got, mh.Total.PromptTokens, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func deref2(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}
