package metrics

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
)

// Source answers PromQL queries: a real Prometheus server ([Prometheus]) or
// a simulator's in-memory series ([StoreSource]). Calibration, the
// planner's observed plans and bench read their data through a Source, so
// the same queries run against a live farm and against a simulated one.
type Source interface {
	// Instant evaluates expr at the instant at (an instant vector; a scalar
	// comes back as one sample without labels).
	Instant(ctx context.Context, expr string, at time.Time) (promql.Vector, error)
	// Range evaluates expr at every step from start to end inclusive.
	Range(ctx context.Context, expr string, start, end time.Time, step time.Duration) (promql.Matrix, error)
	// String names the source in messages: the server's URL, or
	// "simulated store".
	String() string
}

// StoreSource is a [Source] over a [Store], queried by the embedded PromQL
// engine: the simulator's own series.
type StoreSource struct {
	St   *Store
	Eval *Evaluator // nil: a new one
	Name string     // "" : "simulated store"
}

var _ Source = (*StoreSource)(nil)

func (s *StoreSource) eval() *Evaluator {
	if s.Eval == nil {
		s.Eval = NewEvaluator()
	}
	return s.Eval
}

// Instant implements Source.
func (s *StoreSource) Instant(ctx context.Context, expr string, at time.Time) (promql.Vector, error) {
	return s.eval().Instant(ctx, s.St, expr, at)
}

// Range implements Source.
func (s *StoreSource) Range(ctx context.Context, expr string, start, end time.Time, step time.Duration) (promql.Matrix, error) {
	return s.eval().Range(ctx, s.St, expr, start, end, step)
}

func (s *StoreSource) String() string {
	if s.Name != "" {
		return s.Name
	}
	return "simulated store"
}

// Prometheus is a [Source] over a Prometheus server's HTTP API.
type Prometheus struct {
	url string
	api v1.API
}

var _ Source = (*Prometheus)(nil)

// DefaultQueryTimeout bounds one query to a Prometheus server, connection
// included, so that an unreachable server fails quickly.
const DefaultQueryTimeout = 30 * time.Second

// NewPrometheus returns a Source for the server at rawURL
// ("http://host:9090"). timeout bounds each query (0: DefaultQueryTimeout). It
// does not contact the server: call [Ping] for an early, clear error.
func NewPrometheus(rawURL string, timeout time.Duration) (*Prometheus, error) {
	if timeout <= 0 {
		timeout = DefaultQueryTimeout
	}
	rt := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: min(timeout, 5*time.Second)}).DialContext,
		ResponseHeaderTimeout: timeout,
		TLSHandshakeTimeout:   min(timeout, 10*time.Second),
	}
	return newPrometheus(rawURL, api.Config{RoundTripper: rt})
}

// NewPrometheusClient returns a Source for the server at rawURL that sends
// its queries through c, whose transport and limits then apply (bench
// queries with the client it measures with). Like [NewPrometheus], it does
// not contact the server.
func NewPrometheusClient(rawURL string, c *http.Client) (*Prometheus, error) {
	return newPrometheus(rawURL, api.Config{Client: c})
}

func newPrometheus(rawURL string, cfg api.Config) (*Prometheus, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("prometheus URL %q: want http://host:port or https://host:port", rawURL)
	}
	cfg.Address = strings.TrimRight(rawURL, "/")
	c, err := api.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("prometheus URL %q: %w", rawURL, err)
	}
	return &Prometheus{url: rawURL, api: v1.NewAPI(c)}, nil
}

func (p *Prometheus) String() string { return p.url }

// UnreachableError is a Prometheus server that did not answer.
type UnreachableError struct {
	URL string
	Err error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("prometheus at %s is unreachable: %v (is the server running, and is the URL right?)", e.URL, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// wrap tells a transport failure (unreachable) from a query error.
func (p *Prometheus) wrap(expr string, err error) error {
	var apiErr *v1.Error
	if errors.As(err, &apiErr) && apiErr.Type != v1.ErrClient {
		return fmt.Errorf("prometheus at %s: query %q: %w", p.url, expr, err)
	}
	var ue *url.Error
	var ne net.Error
	if errors.As(err, &ue) || errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) {
		return &UnreachableError{URL: p.url, Err: err}
	}
	return fmt.Errorf("prometheus at %s: query %q: %w", p.url, expr, err)
}

// Instant implements Source.
func (p *Prometheus) Instant(ctx context.Context, expr string, at time.Time) (promql.Vector, error) {
	v, _, _, err := p.api.Query(ctx, expr, at)
	if err != nil {
		return nil, p.wrap(expr, err)
	}
	switch x := v.(type) {
	case model.Vector:
		out := make(promql.Vector, 0, len(x))
		for _, s := range x {
			out = append(out, promql.Sample{Metric: toLabels(s.Metric), T: int64(s.Timestamp), F: float64(s.Value)})
		}
		return out, nil
	case *model.Scalar:
		return promql.Vector{{T: int64(x.Timestamp), F: float64(x.Value)}}, nil
	default:
		return nil, fmt.Errorf("prometheus at %s: query %q: result is a %s, want an instant vector", p.url, expr, v.Type())
	}
}

// Range implements Source.
func (p *Prometheus) Range(ctx context.Context, expr string, start, end time.Time, step time.Duration) (promql.Matrix, error) {
	v, _, _, err := p.api.QueryRange(ctx, expr, v1.Range{Start: start, End: end, Step: step})
	if err != nil {
		return nil, p.wrap(expr, err)
	}
	m, ok := v.(model.Matrix)
	if !ok {
		return nil, fmt.Errorf("prometheus at %s: range query %q: result is a %s, want a matrix", p.url, expr, v.Type())
	}
	out := make(promql.Matrix, 0, len(m))
	for _, s := range m {
		ps := promql.Series{Metric: toLabels(s.Metric)}
		for _, sp := range s.Values {
			ps.Floats = append(ps.Floats, promql.FPoint{T: int64(sp.Timestamp), F: float64(sp.Value)})
		}
		out = append(out, ps)
	}
	return out, nil
}

func toLabels(m model.Metric) labels.Labels {
	b := labels.NewScratchBuilder(len(m))
	for k, v := range m {
		b.Add(string(k), string(v))
	}
	b.Sort()
	return b.Labels()
}

// Ping checks that src answers a trivial query, so that an unreachable
// server is reported before any work.
func Ping(ctx context.Context, src Source, at time.Time) error {
	_, err := src.Instant(ctx, "vector(1)", at)
	return err
}

// KPIValues evaluates every KPI of metrics/kpi.promql for model over the
// window of length window that ends at end, on src: the same expressions
// as the simulator's reports. Keys are as [Evaluator.KPIValues]
// makes them (name, or name plus labels for the _by_ KPIs); a KPI without
// data is NaN.
func KPIValues(ctx context.Context, src Source, model string, end time.Time, window time.Duration) (map[string]float64, error) {
	out := map[string]float64{}
	for _, k := range KPIs() {
		v, err := src.Instant(ctx, Expand(k.Expr, model, window), end)
		if err != nil {
			return nil, fmt.Errorf("KPI %s: %w", k.Name, err)
		}
		if len(v) == 0 {
			out[k.Name] = math.NaN()
		}
		for _, s := range v {
			key := k.Name
			if l := s.Metric.DropMetricName(); !l.IsEmpty() {
				key += l.String()
			}
			out[key] = s.F
		}
	}
	return out, nil
}
