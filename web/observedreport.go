package web

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/lm-warden/warden/planner"
)

// ObservedSection is the "prediction vs observation" section of a plan of
// the farm a Prometheus watches: how the farm was calibrated, then every
// KPI of metrics/kpi.promql evaluated by the same PromQL on the simulated
// farm and on the live one over the same window, side by side with the
// relative error, and a chart of the headline figures.
func ObservedSection(o *planner.Observation) Section {
	s := Section{Heading: "Prediction vs observation"}
	c := o.Calibration
	s.Paragraphs = append(s.Paragraphs,
		fmt.Sprintf("The current farm was read from %s for model %s over %s to %s (%s), and simulated over the same window with the routing in use (%s) at the concurrency observed in each part of it (%s sessions).",
			o.Source, o.Model, o.Start.UTC().Format(time.RFC3339), o.End.UTC().Format(time.RFC3339), o.End.Sub(o.Start), o.Strategy, joinIntsWeb(o.Sessions)))
	if c != nil {
		s.Paragraphs = append(s.Paragraphs, fmt.Sprintf("Calibration: %d engines, each with num_gpu_blocks %d x block_size %d = %s KV tokens (read from vllm:cache_config_info); max_num_seqs %d (%s).",
			c.Engines, c.NumGPUBlocks, c.BlockSize, fmtInt(int64(c.KVTokensPerReplica)), c.MaxNumSeqs, c.MaxNumSeqsFrom))
		if f := c.Fit; f != nil {
			s.Paragraphs = append(s.Paragraphs, fmt.Sprintf("Step time fitted by simulation matching on %s and %s: prefill efficiency %.3f, bandwidth efficiency %.3f, fit error %.1f %% (RMS relative, %d iterations); the per-step overhead was %s.",
				f.ITLSeries, f.PrefillSeries, f.PrefillEfficiency, f.BandwidthEfficiency, 100*f.RMSRelErr, f.Iterations, f.Overhead))
		}
		if wl := c.Workload; wl != nil {
			s.Paragraphs = append(s.Paragraphs, fmt.Sprintf("Load (from %s): %.1f concurrent sessions, mean prompt %s tokens, mean answer %s tokens, %.2f turns per session.",
				wl.From, wl.Sessions, fmtNum(wl.MeanPromptTokens, 0), fmtNum(wl.MeanOutputTokens, 0), wl.Turns))
		}
		for _, w := range c.Warnings {
			s.Paragraphs = append(s.Paragraphs, "Warning: "+w)
		}
	}
	t := Table{
		Caption: fmt.Sprintf("Every KPI on the simulated farm and on the live one (error = observed / predicted - 1; drift beyond %.0f %%)", 100*o.Tolerance),
		Header:  []string{"KPI", "unit", "predicted", "observed", "error", "verdict"},
	}
	var names []string
	var pred, obs []float64
	for _, k := range o.KPIs {
		t.Rows = append(t.Rows, []string{k.Title, k.Unit, fmtNum(float64(k.Predicted), digits(float64(k.Predicted))),
			fmtNum(float64(k.Observed), digits(float64(k.Observed))), pctCell(float64(k.RelErr)), k.Verdict})
		if k.Unit == "%" {
			names = append(names, k.Title)
			pred = append(pred, float64(k.Predicted))
			obs = append(obs, float64(k.Observed))
		}
	}
	s.Tables = append(s.Tables, t)
	if len(names) > 0 {
		s.Charts = append(s.Charts, NewBarChart("observed-pct", "Predicted and observed (%)", names, Axis{Name: "%"},
			Series{Name: "predicted", Y: pred}, Series{Name: "observed", Y: obs}))
	}
	return s
}

func digits(v float64) int {
	switch a := math.Abs(v); {
	case a >= 100:
		return 0
	case a >= 10:
		return 1
	default:
		return 2
	}
}

func pctCell(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "-"
	}
	return strings.Replace(fmt.Sprintf("%+.1f %%", 100*v), "+0.0", "0.0", 1)
}
