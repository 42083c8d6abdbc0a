package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/lm-warden/warden/bench"
	"github.com/lm-warden/warden/traces"
)

// benchOptions are the flags of `warden bench`.
type benchOptions struct {
	Target          string
	API             string
	Model           string
	APIKey          string
	Sessions        []int
	Step            time.Duration
	Seed            uint64
	Workload        string
	Speed           float64
	MetricsURLs     []string
	ProxyMetricsURL string
	Prometheus      string
	Label           string
	Timeout         time.Duration
	SampleInterval  time.Duration
	IgnoreEOS       bool
	FreshSteps      bool
	Requests        string
	JSON            bool
	Progress        bool

	// stderr receives warnings and the progress bar; isTerminal, when
	// set, says whether it is a terminal (tests).
	stderr     io.Writer
	isTerminal func() bool
}

func newBenchCmd() *cobra.Command {
	opts := &benchOptions{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Run the synthetic agent sessions against a live endpoint and measure what warden sim predicts",
		Long: `Run the synthetic agent sessions of 'warden sim' (same --seed, same sessions)
closed-loop against any OpenAI- or Anthropic-compatible streaming endpoint: a
warden proxy, vLLM itself, or 'warden emulate'. Each step holds N concurrent
sessions for --step. As in 'warden sim', the load carries on from step to
step: a step's end cuts nothing, the next step starts the sessions it adds
(or retires clients as their sessions end) while the others go on, and only
the last step's end cuts the requests in flight (unfinished). With
--fresh-steps every step's end cuts them and the next step starts all its
sessions at once (compare it with 'warden sim --fresh-steps'): sessions that
start together on one replica stay in step, and each of their first turns
waits for another's prefill, which lengthens the TTFB tail.

--requests FILE writes one JSON line per request as it ends, in the shape of
'warden sim --requests' (session, turn, the step its TTFB counts in, arrival,
TTFB and finish in seconds since the run began, tokens); replica is -1, since
a client does not see which replica served it.

Prompts are text of 4 bytes per token (the canonical-text rule shared with
the proxy's journal and the emulator): one system prompt for every session, a
first message of each session's own, the streamed answers appended. Each
request carries the session's UUID in X-Claude-Code-Session-Id (and, for
Anthropic, metadata.user_id), as Claude Code sends it.

The columns are those of 'warden sim': sessions per hour and output tokens
per minute counted by the client; TTFB p50/p95 measured by the client (send to
the first streamed token), exact quantiles of the step's TTFBs, as the
simulator's KPI is within 2 % (native histograms); replicas busy and prefix hit % from the vLLM /metrics
pages (--metrics-url, default the target's /metrics) or, with --prometheus,
from a Prometheus server with the KPIs of metrics/kpi.promql; stayed % from a
warden proxy's admin /metrics (--proxy-metrics-url), else null.

With --json the result is a 'warden sim --json' report: 'warden compare' and
'warden report' read it.`,
		Example: `  warden bench --target http://127.0.0.1:8080 --sessions 4,8 --step 1m
  warden bench --target http://vllm:8000 --api anthropic --model Qwen/Qwen3-4B-Instruct-2507 --json > bench.json
  warden bench --target http://127.0.0.1:8080 --metrics-url http://127.0.0.1:8000/metrics \
      --proxy-metrics-url http://127.0.0.1:9091/metrics --label affinity --speed 20 --step 3m --json
  warden bench --target http://127.0.0.1:8080 --sessions 4,8 --requests requests.jsonl   # each request's TTFB and times
  warden bench --target http://127.0.0.1:8080 --sessions 4,8 --fresh-steps               # every step's sessions start together`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.stderr = cmd.ErrOrStderr()
			return runBench(cmd.Context(), opts, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Target, "target", "", "base URL of the endpoint (required)")
	f.StringVar(&opts.API, "api", "openai", "API to speak: openai (/v1/chat/completions) or anthropic (/v1/messages)")
	f.StringVar(&opts.Model, "model", "", "model to ask for (default: the first of the target's /v1/models)")
	f.StringVar(&opts.APIKey, "api-key", "", "API key (Authorization: Bearer, or x-api-key for anthropic)")
	f.IntSliceVar(&opts.Sessions, "sessions", bench.DefaultSessions, "concurrent sessions of each step")
	f.DurationVar(&opts.Step, "step", bench.DefaultStep, "length of each step, in the target's time (see --speed)")
	f.Uint64Var(&opts.Seed, "seed", 1, "seed of the synthetic sessions (as warden sim --seed)")
	f.StringVar(&opts.Workload, "workload", "", "workload YAML (default: the product's agent sessions)")
	f.Float64Var(&opts.Speed, "speed", 1, "the target's time compression (warden emulate --speed): steps and think times shrink, measured times grow by it")
	f.StringSliceVar(&opts.MetricsURLs, "metrics-url", nil, "vLLM /metrics pages of the farm, in replica order (default: the target's /metrics)")
	f.StringVar(&opts.ProxyMetricsURL, "proxy-metrics-url", "", "a warden proxy's admin /metrics, for stayed % (e.g. http://127.0.0.1:9091/metrics)")
	f.StringVar(&opts.Prometheus, "prometheus", "", "Prometheus server scraping the farm: hit %, replicas busy and stayed % from the KPIs' PromQL")
	f.StringVar(&opts.Label, "label", bench.DefaultLabel, "the strategy column: the routing the target runs (warden compare matches it with the prediction's)")
	f.DurationVar(&opts.Timeout, "timeout", bench.DefaultTimeout, "timeout of one request, wall time")
	f.DurationVar(&opts.SampleInterval, "sample-interval", bench.DefaultSampleInterval, "wall time between samples of the replicas' load")
	f.BoolVar(&opts.IgnoreEOS, "ignore-eos", true, "send vLLM's ignore_eos (openai), so answers have the workload's lengths")
	f.BoolVar(&opts.FreshSteps, "fresh-steps", false, "cut each step at its end and start the next step's sessions all at once (default: the load carries on from step to step, as warden sim runs it)")
	f.StringVar(&opts.Requests, "requests", "", "write one JSON line per request to this file (the shape of warden sim --requests)")
	f.BoolVar(&opts.JSON, "json", false, "print the result as JSON (the shape of warden sim --json)")
	f.BoolVar(&opts.Progress, "progress", true, "draw a progress bar on stderr (only when stderr is a terminal)")
	_ = cmd.MarkFlagRequired("target")
	return cmd
}

// config builds the benchmark the options describe.
func (o *benchOptions) config() (bench.Config, error) {
	api, err := bench.ParseAPI(o.API)
	if err != nil {
		return bench.Config{}, fmt.Errorf("--api: %w", err)
	}
	if len(o.Sessions) == 0 {
		return bench.Config{}, fmt.Errorf("--sessions: want at least one step, e.g. 4,8,16")
	}
	for _, n := range o.Sessions {
		if n < 1 || n > bench.MaxSessions {
			return bench.Config{}, fmt.Errorf("--sessions %d: want 1 to %d concurrent sessions", n, bench.MaxSessions)
		}
	}
	if o.Step <= 0 {
		return bench.Config{}, fmt.Errorf("--step %v: want a positive duration such as 3m", o.Step)
	}
	if o.Timeout <= 0 || o.SampleInterval <= 0 {
		return bench.Config{}, fmt.Errorf("--timeout and --sample-interval: want positive durations")
	}
	cfg := bench.Config{
		Target: o.Target, API: api, Model: o.Model, APIKey: o.APIKey,
		Sessions: o.Sessions, Step: o.Step, Seed: o.Seed, Speed: o.Speed,
		MetricsURLs: o.MetricsURLs, ProxyMetricsURL: o.ProxyMetricsURL, PrometheusURL: o.Prometheus,
		Label: o.Label, Timeout: o.Timeout, SampleInterval: o.SampleInterval, IgnoreEOS: o.IgnoreEOS,
		FreshSteps: o.FreshSteps,
	}
	if o.Workload != "" {
		if cfg.Workload, err = traces.LoadWorkload(o.Workload); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

func runBench(ctx context.Context, o *benchOptions, out io.Writer) error {
	cfg, err := o.config()
	if err != nil {
		return err
	}
	if o.stderr != nil {
		cfg.Warn = func(msg string) { fmt.Fprintln(o.stderr, "warning:", msg) }
	}
	if bar := newProgressBar(o.Progress, o.stderr, o.isTerminal, "benchmarking", 200*time.Millisecond); bar != nil {
		cfg.Progress = bar.set
		defer bar.finish()
	}
	if err := checkOutPath("--requests", o.Requests); err != nil {
		return err
	}
	var reqs *recordFile
	if o.Requests != "" {
		var err error
		if reqs, err = createRecordFile(o.Requests); err != nil {
			return fmt.Errorf("--requests: %w", err)
		}
		cfg.Requests = reqs
	}
	res, err := bench.Run(ctx, cfg)
	if reqs != nil {
		if ferr := reqs.finish(); ferr != nil && err == nil {
			err = fmt.Errorf("--requests: %w", ferr)
		}
	}
	if err != nil {
		return err
	}
	if o.JSON {
		return writeJSON(out, &res.Report)
	}
	return res.WriteText(out)
}

// recordFile is --requests: lines written to a temporary file beside the
// path, which takes its place once the run ends with at least one record
// (a run cut short keeps what it wrote). A run that wrote nothing (the
// target unreachable, say) leaves an existing file as it was.
type recordFile struct {
	path string
	f    *os.File
	w    *bufio.Writer
	n    int64
}

func createRecordFile(path string) (*recordFile, error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return nil, outError(path, err)
	}
	return &recordFile{path: path, f: f, w: bufio.NewWriter(f)}, nil
}

func (r *recordFile) Write(p []byte) (int, error) {
	n, err := r.w.Write(p)
	r.n += int64(n)
	return n, err
}

// finish flushes and closes the file, and puts it in place when it holds
// a record.
func (r *recordFile) finish() error {
	err := r.w.Flush()
	if cerr := r.f.Close(); err == nil {
		err = cerr
	}
	if err == nil && r.n > 0 {
		err = os.Rename(r.f.Name(), r.path)
	}
	if err != nil || r.n == 0 {
		_ = os.Remove(r.f.Name())
	}
	if err != nil {
		return outError(r.path, err)
	}
	return nil
}
