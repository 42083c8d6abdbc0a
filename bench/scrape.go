package bench

import (
	"context"
	"fmt"
	"github.com/lm-warden/warden/metrics/vllm"
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

// maxMetricsBytes bounds a /metrics page, vLLM's (metrics/vllm.Parse) or
// a warden proxy's (ParseMetrics).
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
	engines  []vllm.Engine
	proxy    proxyCounts
	err      error // the first vLLM page that failed
	proxyErr error // the proxy's page failed
}

// page reads the page at url with parse.
func (s *scraper) page(ctx context.Context, url string, parse func(io.Reader) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	if err := parse(resp.Body); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return nil
}

// scrape reads every page at once.
func (s *scraper) scrape(ctx context.Context, withProxy bool) farm {
	pages := make([][]vllm.Engine, len(s.urls))
	errs := make([]error, len(s.urls))
	var wg sync.WaitGroup
	for i, u := range s.urls {
		wg.Go(func() {
			err := s.page(ctx, u, func(r io.Reader) (err error) {
				pages[i], err = vllm.Parse(r, maxMetricsBytes)
				return err
			})
			if err == nil && len(pages[i]) == 0 {
				err = fmt.Errorf("GET %s: no vllm:* series", u)
			}
			errs[i] = err
		})
	}
	var f farm
	if withProxy && s.proxy != "" {
		var samples []Sample
		err := s.page(ctx, s.proxy, func(r io.Reader) (err error) {
			samples, err = ParseMetrics(r)
			return err
		})
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
func hitPct(a, b []vllm.Engine) float64 {
	if len(a) != len(b) || len(a) == 0 {
		return math.NaN()
	}
	var q, h float64
	for i := range a {
		q += b[i].PrefixQueries - a[i].PrefixQueries
		h += b[i].PrefixHits - a[i].PrefixHits
	}
	return ratioPct(h, q)
}

func ratioPct(a, b float64) float64 {
	if !(b > 0) {
		return math.NaN()
	}
	return 100 * a / b
}
