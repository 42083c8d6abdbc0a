package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	pmodel "github.com/prometheus/common/model"

	"github.com/lm-warden/warden/metrics/names"
)

// maxMetricsBytes bounds a /metrics page.
const maxMetricsBytes = 16 << 20

// Sample is one series' value on a /metrics page.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// ParseMetrics reads Prometheus' text exposition (vLLM's, with colons in
// names, or warden's) into samples of counters, gauges and untyped series;
// histograms and summaries are skipped. *_created series are dropped.
func ParseMetrics(r io.Reader) ([]Sample, error) {
	p := expfmt.NewTextParser(pmodel.UTF8Validation)
	fams, err := p.TextToMetricFamilies(io.LimitReader(r, maxMetricsBytes))
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	names := make([]string, 0, len(fams))
	for n := range fams {
		names = append(names, n)
	}
	slices.Sort(names)
	var out []Sample
	for _, n := range names {
		if len(n) > 8 && n[len(n)-8:] == "_created" {
			continue
		}
		for _, m := range fams[n].GetMetric() {
			var v float64
			switch {
			case m.Counter != nil:
				v = m.GetCounter().GetValue()
			case m.Gauge != nil:
				v = m.GetGauge().GetValue()
			case m.Untyped != nil:
				v = m.GetUntyped().GetValue()
			default:
				continue
			}
			out = append(out, Sample{Name: n, Labels: labelMap(m), Value: v})
		}
	}
	return out, nil
}

func labelMap(m *dto.Metric) map[string]string {
	l := make(map[string]string, len(m.GetLabel()))
	for _, lp := range m.GetLabel() {
		l[lp.GetName()] = lp.GetValue()
	}
	return l
}

// Engine is one vLLM engine's figures at one instant.
type Engine struct {
	Running, Waiting float64
	KVUsage          float64 // 0..1
	Queries, Hits    float64 // prefix cache, tokens
	Requests         float64 // vllm:request_success_total, all finished reasons
	Preemptions      float64
}

// engines sums a vLLM /metrics page's samples per engine label (a page
// without engine labels is engine "0"), sorted by engine number.
func engines(samples []Sample) []Engine {
	type keyed struct {
		id int
		e  Engine
	}
	var list []keyed
	get := func(l map[string]string) *Engine {
		id := 0
		if s, ok := l[names.LabelEngine]; ok {
			n, err := strconv.Atoi(s)
			if err != nil {
				return nil
			}
			id = n
		}
		for i := range list {
			if list[i].id == id {
				return &list[i].e
			}
		}
		list = append(list, keyed{id: id})
		return &list[len(list)-1].e
	}
	for _, s := range samples {
		var f func(*Engine) *float64
		switch s.Name {
		case names.VLLMNumRequestsRunning:
			f = func(e *Engine) *float64 { return &e.Running }
		case names.VLLMNumRequestsWaiting:
			f = func(e *Engine) *float64 { return &e.Waiting }
		case names.VLLMKVCacheUsagePerc:
			f = func(e *Engine) *float64 { return &e.KVUsage }
		case names.VLLMPrefixCacheQueries:
			f = func(e *Engine) *float64 { return &e.Queries }
		case names.VLLMPrefixCacheHits:
			f = func(e *Engine) *float64 { return &e.Hits }
		case names.VLLMRequestSuccess:
			f = func(e *Engine) *float64 { return &e.Requests }
		case names.VLLMNumPreemptions:
			f = func(e *Engine) *float64 { return &e.Preemptions }
		default:
			continue
		}
		if e := get(s.Labels); e != nil {
			*f(e) += s.Value
		}
	}
	slices.SortFunc(list, func(a, b keyed) int { return a.id - b.id })
	out := make([]Engine, len(list))
	for i, k := range list {
		out[i] = k.e
	}
	return out
}

// proxyCounts are a warden proxy's counters for one model.
type proxyCounts struct {
	LaterTurns, LaterHome float64
	Sticky, Spilled       map[int]float64 // by replica index
	ok                    bool            // the page had the model's later-turn counters
}

func proxyFigures(samples []Sample, model string) proxyCounts {
	p := proxyCounts{Sticky: map[int]float64{}, Spilled: map[int]float64{}}
	for _, s := range samples {
		if s.Labels[names.LabelModel] != model {
			continue
		}
		switch s.Name {
		case names.WardenLaterTurns:
			p.LaterTurns += s.Value
			p.ok = true
		case names.WardenLaterTurnsHome:
			p.LaterHome += s.Value
		case names.WardenRequests:
			r, err := strconv.Atoi(s.Labels[names.LabelReplica])
			if err != nil {
				continue
			}
			switch s.Labels[names.LabelReason] {
			case "sticky":
				p.Sticky[r] += s.Value
			case "spill":
				p.Spilled[r] += s.Value
			}
		}
	}
	return p
}

// scraper reads /metrics pages.
type scraper struct {
	client *http.Client
	urls   []string // vLLM pages, in replica order
	proxy  string   // a warden proxy's admin /metrics, or ""
	model  string
}

// farm is every engine of every page at one instant, in replica order:
// the pages in the order given, each page's engines by engine number.
type farm struct {
	engines  []Engine
	proxy    proxyCounts
	err      error // the first vLLM page that failed
	proxyErr error // the proxy's page failed
}

func (s *scraper) page(ctx context.Context, url string) ([]Sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	samples, err := ParseMetrics(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return samples, nil
}

// scrape reads every page at once.
func (s *scraper) scrape(ctx context.Context, withProxy bool) farm {
	pages := make([][]Engine, len(s.urls))
	errs := make([]error, len(s.urls))
	var wg sync.WaitGroup
	for i, u := range s.urls {
		wg.Go(func() {
			samples, err := s.page(ctx, u)
			if err == nil {
				pages[i] = engines(samples)
				if len(pages[i]) == 0 {
					err = fmt.Errorf("GET %s: no vllm:* series", u)
				}
			}
			errs[i] = err
		})
	}
	var f farm
	if withProxy && s.proxy != "" {
		samples, err := s.page(ctx, s.proxy)
		if err == nil {
			f.proxy = proxyFigures(samples, s.model)
			if !f.proxy.ok {
				err = fmt.Errorf("GET %s: no %s{model=%q}", s.proxy, names.WardenLaterTurns, s.model)
			}
		}
		f.proxyErr = err
	}
	wg.Wait()
	for i := range pages {
		if errs[i] != nil && f.err == nil {
			f.err = errs[i]
		}
		f.engines = append(f.engines, pages[i]...)
	}
	return f
}

// busy is how many engines have a request running or waiting.
func (f *farm) busy() int {
	n := 0
	for _, e := range f.engines {
		if e.Running+e.Waiting > 0 {
			n++
		}
	}
	return n
}

// hitPct is 100 x delta hits / delta queries between two instants, NaN
// when nothing was asked or the farms differ.
func hitPct(a, b []Engine) float64 {
	if len(a) != len(b) || len(a) == 0 {
		return math.NaN()
	}
	var q, h float64
	for i := range a {
		q += b[i].Queries - a[i].Queries
		h += b[i].Hits - a[i].Hits
	}
	return ratioPct(h, q)
}

func ratioPct(a, b float64) float64 {
	if !(b > 0) {
		return math.NaN()
	}
	return 100 * a / b
}
