package calibrate

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/traces"
)

// farmYAML mirrors sim.FarmSpec with empty fields left out.
type farmYAML struct {
	Name               string       `yaml:"name,omitempty"`
	Model              string       `yaml:"model,omitempty"`
	ModelConfig        string       `yaml:"model_config,omitempty"`
	WeightsDType       string       `yaml:"weights_dtype,omitempty"`
	KVCacheDType       string       `yaml:"kv_cache_dtype,omitempty"`
	GPU                string       `yaml:"gpu"`
	Replicas           int          `yaml:"replicas"`
	TensorParallelSize int          `yaml:"tensor_parallel_size,omitempty"`
	VLLM               vllmYAML     `yaml:"vllm"`
	Routing            routingYAML  `yaml:"routing,omitempty"`
	ScrapeInterval     sim.Duration `yaml:"scrape_interval,omitempty"`
	StepTime           sim.StepTime `yaml:"step_time"`
}

type vllmYAML struct {
	MaxNumSeqs           int          `yaml:"max_num_seqs,omitempty"`
	MaxNumBatchedTokens  int          `yaml:"max_num_batched_tokens,omitempty"`
	GPUMemoryUtilization float64      `yaml:"gpu_memory_utilization,omitempty"`
	BlockSize            int          `yaml:"block_size"`
	NumGPUBlocks         int          `yaml:"num_gpu_blocks"`
	MaxModelLen          int          `yaml:"max_model_len,omitempty"`
	Version              string       `yaml:"version,omitempty"`
	ReserveFullISL       string       `yaml:"scheduler_reserve_full_isl,omitempty"`
	Watermark            float64      `yaml:"watermark,omitempty"`
	APIServerCount       int          `yaml:"api_server_count,omitempty"`
	StatsUpdateInterval  sim.Duration `yaml:"stats_update_interval,omitempty"`
}

type routingYAML struct {
	Strategy       string       `yaml:"strategy,omitempty"`
	SpillThreshold string       `yaml:"spill_threshold,omitempty"`
	Balancer       string       `yaml:"balancer,omitempty"`
	SessionTTL     sim.Duration `yaml:"session_ttl,omitempty"`
	ActiveWindow   sim.Duration `yaml:"active_window,omitempty"`
	MaxSessions    int          `yaml:"max_sessions,omitempty"`
}

// MarshalFarmSpec writes spec as the YAML that sim.ParseFarm reads,
// leaving out empty fields, after a comment header (each line prefixed
// with "# ").
func MarshalFarmSpec(spec sim.FarmSpec, header []string) ([]byte, error) {
	s := spec
	y := farmYAML{
		Name: s.Name, Model: s.Model, ModelConfig: s.ModelConfig, WeightsDType: s.WeightsDType, KVCacheDType: s.KVCacheDType,
		GPU: s.GPU, Replicas: s.Replicas, TensorParallelSize: s.TensorParallelSize,
		VLLM: vllmYAML{MaxNumSeqs: s.VLLM.MaxNumSeqs, MaxNumBatchedTokens: s.VLLM.MaxNumBatchedTokens, GPUMemoryUtilization: s.VLLM.GPUMemoryUtilization,
			BlockSize: s.VLLM.BlockSize, NumGPUBlocks: s.VLLM.NumGPUBlocks, MaxModelLen: s.VLLM.MaxModelLen,
			Version: s.VLLM.Version, ReserveFullISL: s.VLLM.ReserveFullISL, Watermark: s.VLLM.Watermark,
			APIServerCount: s.VLLM.APIServerCount, StatsUpdateInterval: s.VLLM.StatsUpdateInterval},
		Routing:        routingYAML{Strategy: s.Routing.Strategy, SpillThreshold: s.Routing.SpillThreshold, Balancer: s.Routing.Balancer, SessionTTL: s.Routing.SessionTTL, ActiveWindow: s.Routing.ActiveWindow, MaxSessions: s.Routing.MaxSessions},
		ScrapeInterval: s.ScrapeInterval,
		StepTime:       s.StepTime,
	}
	return marshalWithHeader(y, header)
}

// MarshalWorkload writes w as the YAML that traces.LoadWorkload reads.
func MarshalWorkload(w traces.Workload, header []string) ([]byte, error) {
	return marshalWithHeader(w, header)
}

func marshalWithHeader(v any, header []string) ([]byte, error) {
	var b bytes.Buffer
	for _, h := range header {
		for _, l := range strings.Split(h, "\n") {
			b.WriteString(strings.TrimRight("# "+l, " ") + "\n")
		}
	}
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Header is the comment block of a calibrated farm spec: where it came
// from, the fit and every warning.
func (c *Calibration) Header() []string {
	h := []string{
		fmt.Sprintf("Calibrated by warden calibrate from %s, model %s, window %s.", c.Source, c.Model, c.Window),
		fmt.Sprintf("KV cache: %d engines x num_gpu_blocks %d x block_size %d = %d tokens each (vllm:cache_config_info).",
			c.Engines, c.NumGPUBlocks, c.BlockSize, c.KVTokensPerReplica),
		fmt.Sprintf("max_num_seqs %d from %s; routing %s (%s).", c.MaxNumSeqs, c.MaxNumSeqsFrom, c.Strategy, c.StrategyHow),
	}
	if f := c.Fit; f != nil {
		h = append(h, fmt.Sprintf("step_time fitted by simulation matching (%d iterations): prefill_efficiency %.3f, bandwidth_efficiency %.3f, fit error (RMS relative) %.1f%%; overhead %s.",
			f.Iterations, f.PrefillEfficiency, f.BandwidthEfficiency, 100*f.RMSRelErr, f.Overhead))
	}
	for _, w := range c.Warnings {
		h = append(h, "warning: "+w)
	}
	return h
}

// WriteText writes a calibration as a short human summary.
func (c *Calibration) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "farm of %s on %s, window %s\n", c.Model, c.Source, c.Window)
	fmt.Fprintf(&b, "  engines            %d (routing: %s)\n", c.Engines, c.Strategy)
	fmt.Fprintf(&b, "  KV cache           %d blocks x %d = %d tokens per engine\n", c.NumGPUBlocks, c.BlockSize, c.KVTokensPerReplica)
	fmt.Fprintf(&b, "  max_num_seqs       %d (%s)\n", c.MaxNumSeqs, c.MaxNumSeqsFrom)
	if wl := c.Workload; wl != nil {
		fmt.Fprintf(&b, "  load               %.1f concurrent sessions, mean prompt %.0f tokens, mean output %.0f tokens\n", wl.Sessions, wl.MeanPromptTokens, wl.MeanOutputTokens)
	}
	if f := c.Fit; f != nil {
		fmt.Fprintf(&b, "  step time          prefill_efficiency %.3f, bandwidth_efficiency %.3f, overhead %s (kept)\n",
			f.PrefillEfficiency, f.BandwidthEfficiency, time.Duration(f.StepOverhead))
		fmt.Fprintf(&b, "  fit                %d iterations, error %.1f%% RMS over %d levels\n", f.Iterations, 100*f.RMSRelErr, len(f.Levels))
		fmt.Fprintf(&b, "  %-9s %-8s %-22s %-22s\n", "sessions", "windows", "ITL s (obs / sim)", "prefill s (obs / sim)")
		for _, l := range f.Levels {
			fmt.Fprintf(&b, "  %-9d %-8d %-22s %-22s\n", l.Sessions, l.Windows, pair(float64(l.ObservedITL), float64(l.PredictedITL), 4), pair(float64(l.ObservedPrefill), float64(l.PredictedPrefill), 3))
		}
	}
	for _, x := range c.Warnings {
		fmt.Fprintf(&b, "warning: %s\n", x)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func pair(a, b float64, d int) string {
	f := func(v float64) string {
		if !finite(v) {
			return "-"
		}
		return fmt.Sprintf("%.*f", d, v)
	}
	return f(a) + " / " + f(b)
}
