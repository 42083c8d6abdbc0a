package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/lm-warden/warden/calibrate"
	"github.com/lm-warden/warden/metrics"
	"github.com/lm-warden/warden/sim"
)

// promOptions are the flags shared by the commands that read a farm's
// Prometheus: calibrate, workload, check and plan --prometheus.
type promOptions struct {
	Prometheus string
	Model      string
	Since      time.Duration
	End        string // RFC 3339; "" now
	Timeout    time.Duration
	Windows    int

	// source opens the data source (tests inject a simulated store).
	source func(url string, timeout time.Duration) (metrics.Source, error)
	now    func() time.Time
}

func (o *promOptions) bind(cmd *cobra.Command, defaultSince time.Duration) {
	f := cmd.Flags()
	f.StringVar(&o.Prometheus, "prometheus", "", "URL of the Prometheus server that scrapes the farm (required), e.g. http://localhost:9090")
	f.StringVar(&o.Model, "model", "", "model_name of the farm's vLLM series (required)")
	f.DurationVar(&o.Since, "since", defaultSince, "length of the window read, ending at --end")
	f.StringVar(&o.End, "end", "", "end of the window, RFC 3339 (default: now)")
	f.DurationVar(&o.Timeout, "timeout", metrics.DefaultQueryTimeout, "bound on each query to Prometheus")
	f.IntVar(&o.Windows, "windows", calibrate.DefaultWindows, "parts the window is cut into (load over time, fit levels)")
}

// open checks the flags and returns the source and the window.
func (o *promOptions) open() (metrics.Source, calibrate.Window, error) {
	var w calibrate.Window
	if o.Prometheus == "" {
		return nil, w, errors.New("--prometheus is required (the URL of the server that scrapes the farm)")
	}
	if o.Model == "" {
		return nil, w, errors.New("--model is required (the model_name of the farm's vLLM series)")
	}
	if o.Since < time.Second {
		return nil, w, fmt.Errorf("--since %s: want at least 1s", o.Since)
	}
	end := time.Now()
	if o.now != nil {
		end = o.now()
	}
	if o.End != "" {
		t, err := time.Parse(time.RFC3339, o.End)
		if err != nil {
			return nil, w, fmt.Errorf("--end %q: want RFC 3339, e.g. 2026-11-20T15:04:05Z", o.End)
		}
		end = t
	}
	w = calibrate.Window{Start: end.Add(-o.Since), End: end}
	open := o.source
	if open == nil {
		open = func(url string, timeout time.Duration) (metrics.Source, error) {
			return metrics.NewPrometheus(url, timeout)
		}
	}
	src, err := open(o.Prometheus, o.Timeout)
	return src, w, err
}

// calibrateOptions are the flags of `warden calibrate`.
type calibrateOptions struct {
	promOptions
	GPU        string
	BaseFarm   string
	MaxNumSeqs int
	Journal    string
	Out        string
	JSON       bool
	FitStep    time.Duration
	Seed       uint64
}

func newCalibrateCmd() *cobra.Command {
	opts := &calibrateOptions{}
	cmd := &cobra.Command{
		Use:   "calibrate",
		Short: "Read a live farm's Prometheus into a farm spec, with the step-time model fitted",
		Long: `calibrate reads, through Prometheus's HTTP API, the vLLM series of one model and
warden's own, and writes the farm spec that 'warden sim --farm' uses as is:

  - engines: the series of vllm:num_requests_running;
  - KV cache: vllm:cache_config_info (num_gpu_blocks x block_size: exact);
  - max_num_seqs: when a config-info series exposes it, else --max-num-seqs or
    vLLM's default (a warning says which);
  - routing: warden_requests_total's reasons (affinity, hash, least-loaded), or
    least-loaded when requests reach vLLM directly;
  - step time: prefill_efficiency and bandwidth_efficiency fitted by matching the
    observed mean inter-token latency and prefill time (per concurrency level) with
    a simulation of the farm under the observed load (Gauss-Newton); the fit's
    error is reported. The GPU is not in the metrics: name it with --gpu.

A missing required series is an error naming it; a missing optional one a warning
saying what was assumed.`,
		Example: `  warden calibrate --prometheus http://localhost:9090 --model Qwen/Qwen3-4B-Instruct-2507 \
      --gpu "RTX A4000" --since 6h --out farm.yaml
  warden sim --farm farm.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runCalibrate(cmd.Context(), opts, cmd.OutOrStdout())
		},
	}
	opts.bind(cmd, 6*time.Hour)
	f := cmd.Flags()
	f.StringVar(&opts.GPU, "gpu", "", `catalogue GPU of the farm ("RTX A4000"); required unless --base-farm names one`)
	f.StringVar(&opts.BaseFarm, "base-farm", "", "farm spec to start from (dtypes, tensor parallel size, routing); calibration overwrites what it reads")
	f.IntVar(&opts.MaxNumSeqs, "max-num-seqs", 0, "vLLM max_num_seqs of the farm when the metrics do not expose it (0: vLLM's default)")
	f.StringVar(&opts.Journal, "journal", "", "the proxy's journal over the window: the load is read from it instead of inferred")
	f.StringVar(&opts.Out, "out", "", `farm spec file to write ("": print it)`)
	f.BoolVar(&opts.JSON, "json", false, "print the calibration (sources, fit, warnings) as JSON")
	f.DurationVar(&opts.FitStep, "fit-step", calibrate.DefaultFitStep, "simulated time per concurrency level in each fit evaluation")
	f.Uint64Var(&opts.Seed, "seed", 1, "seed of the simulated sessions of the fit")
	return cmd
}

// calibrate runs the calibration the flags describe.
func (o *calibrateOptions) calibrate(ctx context.Context) (*calibrate.Calibration, error) {
	src, w, err := o.open()
	if err != nil {
		return nil, err
	}
	var base sim.FarmSpec
	if o.BaseFarm != "" {
		f, err := sim.LoadFarm(o.BaseFarm)
		if err != nil {
			return nil, err
		}
		base = f.Spec
		base.StepTime = sim.StepTime{} // refitted; zero fields start from the defaults
		base.Name = ""
	}
	if o.MaxNumSeqs > 0 {
		base.VLLM.MaxNumSeqs = o.MaxNumSeqs
	}
	co := calibrate.Options{Model: o.Model, Window: w, GPU: o.GPU, Base: base, Windows: o.Windows,
		Fit: calibrate.FitOptions{Step: o.FitStep, Seed: o.Seed}}
	if o.Journal != "" {
		if co.Workload, err = calibrate.FromJournal(o.Journal); err != nil {
			return nil, err
		}
	}
	return calibrate.Calibrate(ctx, src, co)
}

func runCalibrate(ctx context.Context, o *calibrateOptions, out io.Writer) error {
	if err := checkOutPath("--out", o.Out); err != nil {
		return err
	}
	c, err := o.calibrate(ctx)
	if err != nil {
		return err
	}
	data, err := calibrate.MarshalFarmSpec(c.Spec, c.Header())
	if err != nil {
		return err
	}
	if o.Out != "" {
		if err := writeOutFile(o.Out, data); err != nil {
			return err
		}
	}
	if o.JSON {
		return writeJSON(out, c)
	}
	if err := c.WriteText(out); err != nil {
		return err
	}
	if o.Out != "" {
		_, err = fmt.Fprintf(out, "farm spec: %s\n", o.Out)
		return err
	}
	_, err = fmt.Fprintf(out, "\n%s", data)
	return err
}
