package promtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"

	"github.com/lm-warden/warden/internal/testproc"
)

// InstallHint is the command that installs the server on Debian and Ubuntu.
const InstallHint = "sudo apt-get install -y prometheus"

// Limits of the helper. They bound waits on a loaded machine; a test never
// asserts on how long anything took.
const (
	// DefaultScrapeInterval is used when Options.ScrapeInterval is zero.
	DefaultScrapeInterval = time.Second
	// readyTimeout bounds the wait for /-/ready after the process started.
	readyTimeout = 60 * time.Second
	// stopGrace is how long a SIGTERM is given before SIGKILL.
	stopGrace = 10 * time.Second
	// waitSlack is added to every scrape wait beyond the scrapes themselves.
	waitSlack = 30 * time.Second
	// launchAttempts bounds retries when the chosen port was taken between
	// picking it and the server binding it.
	launchAttempts = 4
	// jobName is the job of Options.Targets.
	jobName = "promtest"
)

// Options configures a server started by [Start].
type Options struct {
	// Targets are scraped as one job named "promtest", as host:port.
	Targets []string
	// MetricsPath of Targets; "/metrics" when empty.
	MetricsPath string
	// ScrapeInterval is both the global scrape and evaluation interval
	// (DefaultScrapeInterval when zero). Scrape timeout equals it.
	ScrapeInterval time.Duration
	// ExtraJobs are further scrape jobs (another metrics path, say).
	ExtraJobs []Job

	// pickPort overrides freePort in tests of the retry path.
	pickPort func() (int, error)
}

// Job is one additional scrape job. Its targets get label job=<Name>.
type Job struct {
	Name        string   // required, unique, not "promtest"
	Targets     []string // host:port
	MetricsPath string   // "/metrics" when empty
}

// Server is a running Prometheus server. It is stopped by the test's
// cleanup. Its methods may be called from the test's goroutine only (they
// call t.Fatal).
type Server struct {
	// URL is the server's base URL, http://127.0.0.1:<port>.
	URL string

	interval time.Duration
	targets  int // distinct (job, target) pairs
	api      v1.API
	tr       *http.Transport
	log      *testproc.Output
}

// Start starts a Prometheus server that scrapes opts' targets and waits
// until it is ready. It skips the test when the binary is not on PATH,
// unless the environment has CI=true, where it fails.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	bin := testproc.Find(t, "promtest", "prometheus", InstallHint)
	if opts.ScrapeInterval <= 0 {
		opts.ScrapeInterval = DefaultScrapeInterval
	}
	if opts.ScrapeInterval < time.Millisecond {
		t.Fatalf("promtest: Options.ScrapeInterval %s is under 1ms", opts.ScrapeInterval)
	}
	cfg, ntargets, err := configYAML(opts)
	if err != nil {
		t.Fatalf("promtest: %v", err)
	}
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
		t.Fatalf("promtest: write config: %v", err)
	}
	for attempt := 1; ; attempt++ {
		pick := opts.pickPort
		if pick == nil {
			pick = testproc.FreePort
		}
		s, err := launch(t, bin, cfgPath, filepath.Join(dir, fmt.Sprintf("data%d", attempt)), pick)
		if errors.Is(err, errAddrInUse) && attempt < launchAttempts {
			t.Logf("promtest: port taken before prometheus bound it; retrying (%d/%d)", attempt, launchAttempts)
			continue
		}
		if err != nil {
			t.Fatalf("promtest: %v", err)
		}
		s.interval = opts.ScrapeInterval
		s.targets = ntargets
		return s
	}
}

var errAddrInUse = errors.New("address already in use")

// launch starts one process on a freshly picked port and waits for
// /-/ready. On success it registers the cleanup that stops the process.
func launch(t testing.TB, bin, cfgPath, dataDir string, pickPort func() (int, error)) (*Server, error) {
	port, err := pickPort()
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	log := &testproc.Output{}
	cmd := exec.Command(bin,
		"--config.file="+cfgPath,
		"--storage.tsdb.path="+dataDir,
		"--web.listen-address="+addr,
		"--web.enable-lifecycle",
		"--log.level=info",
		// Scrape protobuf and store native histograms, which the TTFB KPIs
		// of metrics/kpi.promql read (warden_ttfb_seconds has one). A target
		// with text exposition only (vLLM, the fakes) is scraped as before.
		"--enable-feature=native-histograms",
	)
	cmd.Stdout = log
	cmd.Stderr = log
	proc, err := testproc.Start(cmd)
	if err != nil {
		return nil, err
	}
	done := proc.Done()
	stop := func() { proc.Stop(stopGrace) }

	s := &Server{URL: "http://" + addr, log: log, tr: &http.Transport{}}
	if err := s.waitReady(done); err != nil {
		stop()
		s.tr.CloseIdleConnections()
		select {
		case <-done:
			if strings.Contains(log.String(), "address already in use") {
				return nil, errAddrInUse
			}
			err = fmt.Errorf("%w (exit: %v)", err, proc.Err())
		default:
		}
		return nil, fmt.Errorf("%v; prometheus log:\n%s", err, log.String())
	}
	client, err := api.NewClient(api.Config{Address: s.URL, RoundTripper: s.tr})
	if err != nil {
		stop()
		return nil, fmt.Errorf("api client for %s: %w", s.URL, err)
	}
	s.api = v1.NewAPI(client)
	t.Cleanup(func() {
		stop()
		s.tr.CloseIdleConnections()
		if t.Failed() {
			t.Logf("promtest: prometheus log (%s):\n%s", s.URL, log.String())
		}
	})
	return s, nil
}

// waitReady polls /-/ready until it answers 200, the process exits or
// readyTimeout passes.
func (s *Server) waitReady(exited <-chan struct{}) error {
	client := &http.Client{Transport: s.tr, Timeout: 2 * time.Second}
	deadline := time.Now().Add(readyTimeout)
	for {
		resp, err := client.Get(s.URL + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("prometheus at %s not ready after %s (last: %v)", s.URL, readyTimeout, err)
		}
		select {
		case <-exited:
			return fmt.Errorf("prometheus exited before it was ready")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// WaitScraped waits until every target of every job has been scraped at
// least n times (counting samples of the synthetic "up" series, whatever the
// scrape's outcome). It fails the test, with the targets' last errors, when
// that takes far longer than n scrape intervals.
func (s *Server) WaitScraped(t testing.TB, n int) {
	t.Helper()
	s.waitUp(t, fmt.Sprintf("scraped %d times", n), n, "count_over_time(up[1h])", func(v float64) bool { return v >= float64(n) })
}

// Sync waits until every target has been scraped by a scrape that started
// after Sync was called, so that the server holds each target's state as it
// was at the call or later. Use it after changing the targets' state and
// before querying.
func (s *Server) Sync(t testing.TB) {
	t.Helper()
	// A sample's timestamp is its scrape's start, possibly aligned by up to
	// 2 ms to the scrape ticker (Prometheus's ScrapeTimestampTolerance).
	since := float64(time.Now().Add(3*time.Millisecond).UnixMilli()) / 1000
	s.waitUp(t, "scraped since the call", 2, "timestamp(up)", func(v float64) bool { return v > since })
}

// waitUp polls expr (one sample per target) until all targets are present
// and ok holds for each, for up to scrapes intervals plus waitSlack.
func (s *Server) waitUp(t testing.TB, what string, scrapes int, expr string, ok func(float64) bool) {
	t.Helper()
	poll := max(s.interval/5, 20*time.Millisecond)
	deadline := time.Now().Add(waitSlack + 2*time.Duration(scrapes)*s.interval)
	var last string
	for {
		vec, err := s.query(expr, time.Now())
		switch {
		case err != nil:
			last = err.Error()
		default:
			done := 0
			for _, smp := range vec {
				if ok(float64(smp.Value)) {
					done++
				}
			}
			if done >= s.targets {
				return
			}
			last = fmt.Sprintf("%d of %d targets %s: %s = %v", done, s.targets, what, expr, vec)
		}
		if time.Now().After(deadline) {
			t.Fatalf("promtest: targets not %s: %s\ntargets: %s", what, last, s.targetsReport())
		}
		time.Sleep(poll)
	}
}

// targetsReport describes the active targets' health for a failure message.
func (s *Server) targetsReport() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := s.api.Targets(ctx)
	if err != nil {
		return "targets API: " + err.Error()
	}
	var b strings.Builder
	for _, tg := range res.Active {
		fmt.Fprintf(&b, "\n  %s health=%s last=%s err=%q", tg.ScrapeURL, tg.Health, tg.LastScrape.Format(time.RFC3339Nano), tg.LastError)
	}
	return b.String()
}

// Query evaluates expr at the instant at (now when at is zero) and returns
// the result as a vector; a scalar becomes one sample without labels. It
// fails the test on an error or another result type, and logs warnings.
func (s *Server) Query(t testing.TB, expr string, at time.Time) model.Vector {
	t.Helper()
	if at.IsZero() {
		at = time.Now()
	}
	vec, err := s.query(expr, at)
	if err != nil {
		t.Fatalf("promtest: %v", err)
	}
	return vec
}

func (s *Server) query(expr string, at time.Time) (model.Vector, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	val, warnings, _, err := s.api.Query(ctx, expr, at)
	if err != nil {
		return nil, fmt.Errorf("query %q at %s: %w", expr, at.UTC().Format(time.RFC3339Nano), err)
	}
	if len(warnings) > 0 {
		return nil, fmt.Errorf("query %q: warnings %v", expr, warnings)
	}
	switch v := val.(type) {
	case model.Vector:
		return v, nil
	case *model.Scalar:
		return model.Vector{{Timestamp: v.Timestamp, Value: v.Value, Metric: model.Metric{}}}, nil
	default:
		return nil, fmt.Errorf("query %q: result is a %s, want a vector or scalar", expr, val.Type())
	}
}

// configYAML renders the server's configuration and counts the distinct
// targets it scrapes.
func configYAML(opts Options) ([]byte, int, error) {
	type staticConfig struct {
		Targets []string `yaml:"targets"`
	}
	type scrapeConfig struct {
		JobName       string         `yaml:"job_name"`
		MetricsPath   string         `yaml:"metrics_path"`
		HonorLabels   bool           `yaml:"honor_labels"`
		StaticConfigs []staticConfig `yaml:"static_configs"`
	}
	type global struct {
		ScrapeInterval     string `yaml:"scrape_interval"`
		ScrapeTimeout      string `yaml:"scrape_timeout"`
		EvaluationInterval string `yaml:"evaluation_interval"`
	}
	type config struct {
		Global        global         `yaml:"global"`
		ScrapeConfigs []scrapeConfig `yaml:"scrape_configs"`
	}
	iv := strconv.FormatInt(opts.ScrapeInterval.Milliseconds(), 10) + "ms"
	cfg := config{Global: global{ScrapeInterval: iv, ScrapeTimeout: iv, EvaluationInterval: iv}}
	jobs := append([]Job{{Name: jobName, Targets: opts.Targets, MetricsPath: opts.MetricsPath}}, opts.ExtraJobs...)
	seen := map[string]bool{}
	n := 0
	for i, j := range jobs {
		if j.Name == "" || seen[j.Name] {
			return nil, 0, fmt.Errorf("Options.ExtraJobs[%d]: job name %q is empty or used twice (%q is taken by Options.Targets)", i-1, j.Name, jobName)
		}
		seen[j.Name] = true
		if len(j.Targets) == 0 {
			if i == 0 && len(opts.ExtraJobs) > 0 {
				continue
			}
			return nil, 0, fmt.Errorf("job %q has no targets (want host:port entries)", j.Name)
		}
		uniq := map[string]bool{}
		for _, tg := range j.Targets {
			if _, _, err := net.SplitHostPort(tg); err != nil || strings.Contains(tg, "/") {
				return nil, 0, fmt.Errorf("job %q: target %q is not host:port", j.Name, tg)
			}
			if !uniq[tg] {
				uniq[tg] = true
				n++
			}
		}
		path := j.MetricsPath
		if path == "" {
			path = "/metrics"
		}
		cfg.ScrapeConfigs = append(cfg.ScrapeConfigs, scrapeConfig{
			JobName: j.Name, MetricsPath: path, HonorLabels: true,
			StaticConfigs: []staticConfig{{Targets: j.Targets}},
		})
	}
	out, err := yaml.Marshal(cfg)
	return out, n, err
}
