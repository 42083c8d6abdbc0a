package promtest

import (
	"flag"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/goleak"

	"github.com/lm-warden/warden/internal/testproc"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// target is a tiny /metrics endpoint with one gauge and one counter.
func target(t *testing.T) (g prometheus.Gauge, c prometheus.Counter, hostport string) {
	t.Helper()
	reg := prometheus.NewRegistry()
	g = prometheus.NewGauge(prometheus.GaugeOpts{Name: "promtest_gauge", Help: "A gauge."})
	c = prometheus.NewCounter(prometheus.CounterOpts{Name: "promtest_events_total", Help: "Events."})
	reg.MustRegister(g, c)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/other/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return g, c, strings.TrimPrefix(srv.URL, "http://")
}

func TestPrometheusScrapesAndAnswers(t *testing.T) {
	t.Parallel()
	g, c, hp := target(t)
	g.Set(42)
	c.Add(7)
	srv := Start(t, Options{
		Targets:        []string{hp},
		ScrapeInterval: 200 * time.Millisecond,
		ExtraJobs:      []Job{{Name: "other", Targets: []string{hp}, MetricsPath: "/other/metrics"}},
	})
	if !strings.HasPrefix(srv.URL, "http://127.0.0.1:") {
		t.Errorf("URL = %q, want http://127.0.0.1:<port>", srv.URL)
	}
	srv.WaitScraped(t, 2)

	got := srv.Query(t, `promtest_gauge{job="promtest"}`, time.Time{})
	if len(got) != 1 || got[0].Value != 42 {
		t.Fatalf("promtest_gauge = %v, want one sample of 42", got)
	}
	if inst := string(got[0].Metric["instance"]); inst != hp {
		t.Errorf("instance label = %q, want %q", inst, hp)
	}
	got = srv.Query(t, `count(up == 1)`, time.Time{})
	if len(got) != 1 || got[0].Value != 2 {
		t.Fatalf("count(up == 1) = %v, want 2 (both jobs up)", got)
	}

	// A change made before Sync is visible after it.
	g.Set(43)
	c.Add(5)
	srv.Sync(t)
	got = srv.Query(t, `sum(promtest_events_total) + sum(promtest_gauge)`, time.Time{})
	if want := 2*12.0 + 2*43; len(got) != 1 || float64(got[0].Value) != want {
		t.Fatalf("events + gauge over two jobs = %v, want %v", got, want)
	}

	// A scalar result comes back as one unlabelled sample.
	got = srv.Query(t, `scalar(sum(promtest_gauge{job="other"}))`, time.Time{})
	if len(got) != 1 || got[0].Value != 43 || len(got[0].Metric) != 0 {
		t.Fatalf("scalar = %v, want one unlabelled 43", got)
	}
}

func TestPrometheusStartRetriesWhenPortIsTaken(t *testing.T) {
	t.Parallel()
	// The first port offered is held by another listener, as when another
	// process binds the picked port before prometheus does.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	calls := 0
	pick := func() (int, error) {
		calls++
		if calls == 1 {
			return l.Addr().(*net.TCPAddr).Port, nil
		}
		return testproc.FreePort()
	}
	_, _, hp := target(t)
	srv := Start(t, Options{Targets: []string{hp}, ScrapeInterval: 200 * time.Millisecond, pickPort: pick})
	if calls != 2 {
		t.Errorf("ports picked = %d, want 2 (one taken, one free)", calls)
	}
	if strings.HasSuffix(srv.URL, l.Addr().String()) {
		t.Errorf("server URL %s uses the taken port", srv.URL)
	}
	srv.WaitScraped(t, 1)
}

func TestConfigYAML(t *testing.T) {
	cfg, n, err := configYAML(Options{
		Targets:        []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:1"},
		ScrapeInterval: 1500 * time.Millisecond,
		ExtraJobs:      []Job{{Name: "admin", Targets: []string{"127.0.0.1:3"}, MetricsPath: "/admin/metrics"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Errorf("distinct targets = %d, want 3", n)
	}
	golden := filepath.Join("testdata", "config.yml.golden")
	if *update {
		if err := os.WriteFile(golden, cfg, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if d := cmp.Diff(string(want), string(cfg)); d != "" {
		t.Errorf("config differs from %s (-want +got):\n%s", golden, d)
	}
}

func TestConfigYAMLErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		want string
	}{
		{"no targets", Options{}, `job "promtest" has no targets`},
		{"url not host:port", Options{Targets: []string{"http://127.0.0.1:1/metrics"}}, `not host:port`},
		{"missing port", Options{Targets: []string{"127.0.0.1"}}, `not host:port`},
		{"job name taken", Options{Targets: []string{"a:1"}, ExtraJobs: []Job{{Name: "promtest", Targets: []string{"b:1"}}}}, `used twice`},
		{"job name empty", Options{Targets: []string{"a:1"}, ExtraJobs: []Job{{Targets: []string{"b:1"}}}}, `ExtraJobs[0]`},
		{"extra job without targets", Options{ExtraJobs: []Job{{Name: "x"}}}, `job "x" has no targets`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.ScrapeInterval = time.Second
			_, _, err := configYAML(tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestConfigOnlyExtraJobs(t *testing.T) {
	cfg, n, err := configYAML(Options{ScrapeInterval: time.Second, ExtraJobs: []Job{{Name: "x", Targets: []string{"a:1"}}}})
	if err != nil || n != 1 || strings.Contains(string(cfg), "promtest") {
		t.Fatalf("cfg=%s n=%d err=%v, want only job x", cfg, n, err)
	}
}
