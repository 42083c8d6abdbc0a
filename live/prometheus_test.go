package live

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	pmodel "github.com/prometheus/common/model"

	"github.com/lm-warden/warden/internal/fakevllm"
	"github.com/lm-warden/warden/metrics"
	"github.com/lm-warden/warden/metrics/names"
	"github.com/lm-warden/warden/metrics/promtest"
)

// TestPrometheusEvaluatesKPIs is the real-Prometheus check: a real
// Prometheus server (Debian's package, on 127.0.0.1) scrapes the proxy's
// admin /metrics and a fake vLLM server with two data-parallel engines,
// traffic runs through the proxy, and the simulator's KPI PromQL
// (metrics/kpi.promql, sent verbatim after metrics.Expand) is evaluated by
// that server. Its answers must agree with what the fake and the proxy
// counted themselves: hit rate per engine and overall exactly, stayed %
// exactly, TTFB p50 and p95 within 2% of the exact quantile of the
// proxy's TTFBs (Prometheus runs with native histograms, as promtest
// starts it; see ttfbExactBounds).
func TestPrometheusEvaluatesKPIs(t *testing.T) {
	const name = "m"
	f := fakevllm.New(t, 2)
	f.Model = name // its model_name label, which the KPIs select on
	f.Tokens = 2
	f.TokenDelay = 25 * time.Millisecond // every streamed TTFB is at least this
	f.Hold = make(chan struct{})         // streams pause after their first token until closed
	h := startProxy(t, modelsYAML("", "  - name: "+name+"\n    url: "+f.URL()+"\n    data_parallel_size: 2\n    spill_threshold: 1\n"))
	// Prometheus applies its targets about 5 s after it starts: start it
	// first and let the traffic below run meanwhile.
	prom := promtest.Start(t, promtest.Options{
		Targets:        []string{strings.TrimPrefix(h.admin, "http://"), strings.TrimPrefix(f.URL(), "http://")},
		ScrapeInterval: 250 * time.Millisecond,
	})
	h.scraped()
	// The TTFB KPIs count the observations after Prometheus's first scrape
	// of the proxy (increase() over the window): let it see the empty
	// histogram before any traffic.
	prom.WaitScraped(t, 1)

	// A spill and a return home (as TestSpillAndReturnHome): session "sp"
	// is homed by a JSON turn, two streamed turns are held in flight at
	// home, the next turn spills (2 > threshold 1), the last returns home.
	post := func(session string, turn int, stream bool) {
		t.Helper()
		if r := h.do("POST", "/v1/chat/completions", chatBody(name, session, turn, stream), sessionHdr(session)); r.status != 200 {
			t.Fatalf("%s turn %d: %d %s", session, turn, r.status, r.body)
		}
	}
	post("sp", 0, false)
	home := onlyOne(t, f.Served(), 1)
	var wg sync.WaitGroup
	for turn := 1; turn <= 2; turn++ {
		wg.Go(func() { post("sp", turn, true) })
		h.waitFor("turns in flight at home", func(StatusReport) bool { return f.Served()[home] == turn+1 })
	}
	post("sp", 3, false)
	if got := f.Served(); got[1-home] != 1 {
		t.Fatalf("per engine %v: turn 3 did not spill from %d", got, home)
	}
	close(f.Hold)
	wg.Wait()
	h.waitFor("home drained", func(st StatusReport) bool { return st.Models[0].InFlight == 0 })
	post("sp", 4, false)

	// Four streamed sessions of four turns, one after another: all stay home.
	for s := range 4 {
		for turn := range 4 {
			post(fmt.Sprintf("s%d", s), turn, true)
		}
	}
	const requests, later, laterHome = 5 + 16, 4 + 12, 3 + 12

	// The proxy counts a request just after its response went out: wait
	// for it, then for a scrape of every target that began after that.
	h.waitMetrics(fmt.Sprintf(`warden_ttfb_seconds_count{model="m"} %d`, requests))
	prom.WaitScraped(t, 2)
	prom.Sync(t)

	// What the fake and the proxy counted directly.
	var queries, cached []float64
	for _, c := range f.PerEngine() {
		queries, cached = append(queries, c.Queries), append(cached, c.Hits)
	}
	st := h.status().Models[0]
	if st.LaterTurns != later || st.LaterTurnsHome != laterHome {
		t.Fatalf("proxy counted %d later turns, %d home; want %d, %d", st.LaterTurns, st.LaterTurnsHome, later, laterHome)
	}
	ttfbNative := nativeTTFB(t, h.admin+"/metrics")
	if got := ttfbNative.GetSampleCount(); got != requests {
		t.Fatalf("native warden_ttfb_seconds counts %d, want %d", got, requests)
	}

	// Every KPI, over a window reaching back before the first scrape (so
	// each counter counts from zero), as the planner sends it.
	const window = time.Hour
	now := time.Now()
	got := map[string]pmodel.Vector{}
	for _, k := range metrics.KPIs() {
		got[k.Name] = prom.Query(t, metrics.Expand(k.Expr, name, window), now)
	}
	one := func(kpi string) float64 {
		t.Helper()
		v := got[kpi]
		if len(v) != 1 {
			t.Fatalf("%s: %d samples %v, want 1", kpi, len(v), v)
		}
		return float64(v[0].Value)
	}

	byEngine := map[string]float64{}
	for _, smp := range got["prefix_hit_pct_by_engine"] {
		byEngine[string(smp.Metric["engine"])] = float64(smp.Value)
	}
	if len(byEngine) != 2 {
		t.Fatalf("prefix_hit_pct_by_engine = %v, want engines 0 and 1", got["prefix_hit_pct_by_engine"])
	}
	for e := range 2 {
		want := 100 * cached[e] / queries[e]
		if v, ok := byEngine[strconv.Itoa(e)]; !ok || v != want {
			t.Errorf("prefix_hit_pct_by_engine{engine=%d} = %v, want %v (fake: %v hits / %v queries)", e, v, want, cached[e], queries[e])
		}
	}
	if want := 100 * (cached[0] + cached[1]) / (queries[0] + queries[1]); one("prefix_hit_pct") != want {
		t.Errorf("prefix_hit_pct = %v, want %v", one("prefix_hit_pct"), want)
	}
	if want := 100.0 * laterHome / later; one("stayed_pct") != want {
		t.Errorf("stayed_pct = %v, want %v", one("stayed_pct"), want)
	}
	for _, c := range []struct {
		kpi string
		q   float64
	}{{"ttfb_p50_s", 0.5}, {"ttfb_p95_s", 0.95}} {
		got := one(c.kpi)
		lo, hi := ttfbExactBounds(t, ttfbNative, c.q)
		// Within 2% of every value the exact quantile can have.
		if !(got >= 0.98*hi && got <= 1.02*lo) {
			t.Errorf("%s = %v, want within 2%% of the exact quantile, which lies in [%v, %v]", c.kpi, got, lo, hi)
		}
		t.Logf("%s = %v; exact quantile in [%v, %v]", c.kpi, got, lo, hi)
		if lo < 0.02 && c.q == 0.95 {
			t.Errorf("%s exact quantile [%v, %v] is below the fake's %v token delay", c.kpi, lo, hi, f.TokenDelay)
		}
	}
	reasons := map[string]float64{}
	for _, smp := range got["requests_by_reason"] {
		reasons[string(smp.Metric["reason"])] = float64(smp.Value)
	}
	if reasons["new"] != 5 || reasons["sticky"] != laterHome || reasons["spill"] != 1 {
		t.Errorf("requests_by_reason = %v, want new 5, sticky %d, spill 1", reasons, laterHome)
	}
	for _, k := range metrics.KPIs() {
		t.Logf("%-28s %v", k.Name, got[k.Name])
	}
}

// nativeTTFB reads the proxy's warden_ttfb_seconds{model="m"} in protobuf
// exposition, which carries its native buckets (the text format does not).
func nativeTTFB(t *testing.T, url string) *dto.Histogram {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeProtoDelim)))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	dec := expfmt.NewDecoder(res.Body, expfmt.ResponseFormat(res.Header))
	for {
		var mf dto.MetricFamily
		if err := dec.Decode(&mf); err != nil {
			t.Fatalf("%s: no %s in the protobuf exposition (%v)", url, names.WardenTTFB, err)
		}
		if mf.GetName() != names.WardenTTFB {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "model" && lp.GetValue() == "m" {
					if h := m.GetHistogram(); h.GetSchema() != names.WardenTTFBNative().Schema() || len(h.GetPositiveSpan()) == 0 {
						t.Fatalf("%s has no native buckets at schema %d: %v", names.WardenTTFB, names.WardenTTFBNative().Schema(), h)
					}
					return m.GetHistogram()
				}
			}
		}
	}
}

// ttfbExactBounds bounds the exact q-quantile of the observations of a
// native histogram, as the simulator defines it (linear interpolation
// between the order statistics around position q*(n-1)): each order
// statistic lies in its bucket (lower bound exclusive, upper inclusive), so
// the quantile lies between the interpolation of the buckets' lower bounds
// and that of their upper bounds, 0.54% apart at schema 7.
func ttfbExactBounds(t *testing.T, h *dto.Histogram, q float64) (lo, hi float64) {
	t.Helper()
	type bucket struct{ lo, hi float64 }
	var order []bucket // one entry per observation, ascending
	base := math.Exp2(math.Exp2(-float64(h.GetSchema())))
	for range h.GetZeroCount() {
		order = append(order, bucket{0, h.GetZeroThreshold()})
	}
	idx, count := int32(0), int64(0)
	deltas := h.GetPositiveDelta()
	for _, sp := range h.GetPositiveSpan() {
		idx += sp.GetOffset()
		for range sp.GetLength() {
			count += deltas[0]
			deltas = deltas[1:]
			up := math.Pow(base, float64(idx))
			for range count {
				order = append(order, bucket{up / base, up})
			}
			idx++
		}
	}
	if len(order) == 0 || len(h.GetNegativeSpan()) > 0 {
		t.Fatalf("native histogram with %d observations, %d negative spans", len(order), len(h.GetNegativeSpan()))
	}
	pos := q * float64(len(order)-1)
	l := int(math.Floor(pos))
	u := min(l+1, len(order)-1)
	f := pos - float64(l)
	return order[l].lo*(1-f) + order[u].lo*f, order[l].hi*(1-f) + order[u].hi*f
}
