package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lm-warden/warden/hardware"

	"github.com/lm-warden/warden/calibrate"
	"github.com/lm-warden/warden/metrics"
	"github.com/lm-warden/warden/planner"
)

// planPromOptions are the flags of `warden plan --prometheus`.
type planPromOptions struct {
	Prometheus string
	Since      time.Duration
	End        string
	CurrentGPU string
	Journal    string
	Tolerance  float64

	source func(url string, timeout time.Duration) (metrics.Source, error)
	now    func() time.Time
}

// solveObserved is `warden plan --prometheus`: the farm Prometheus
// watches, under its load, plus the candidates the flags name.
func (o *planOptions) solveObserved(ctx context.Context) (*planner.Result, error) {
	po := &o.prom
	if o.PlanFile != "" {
		return nil, errors.New("--prometheus replaces a plan file: give candidates with --gpu and --replicas")
	}
	if o.Model == "" {
		return nil, errors.New("--prometheus needs --model (the model_name of the farm's vLLM series)")
	}
	gpu := po.CurrentGPU
	if gpu == "" && len(o.GPUs) == 1 {
		gpu = o.GPUs[0]
	}
	if gpu == "" {
		return nil, errors.New("--prometheus needs --current-gpu (the catalogue GPU of the farm: metrics do not name it)")
	}
	if _, err := hardware.LookupGPU(gpu); err != nil {
		return nil, fmt.Errorf("--current-gpu: %w", err)
	}
	src, w, err := (&promOptions{Prometheus: po.Prometheus, Model: o.Model, Since: po.Since, End: po.End, Timeout: metrics.DefaultQueryTimeout,
		source: po.source, now: po.now}).open()
	if err != nil {
		return nil, err
	}
	var p planner.Plan
	extra := []int(nil)
	if len(o.GPUs) > 0 && !(len(o.GPUs) == 1 && o.GPUs[0] == gpu) {
		if p, err = o.buildPlan(); err != nil {
			return nil, err
		}
	} else {
		if o.changed != nil && o.changed("replicas") {
			extra = o.Replicas
		}
		saved := o.GPUs
		o.GPUs = nil
		p, err = o.buildPlan()
		o.GPUs = saved
		if err != nil {
			return nil, err
		}
		p.Farms = nil // the built-in example's candidates are not wanted
		if o.changed == nil || !o.changed("sessions") {
			p.Sessions = nil
		}
		if o.changed == nil || !o.changed("concurrency") {
			p.Concurrency = 0
		}
		p.Name = ""
	}
	co := calibrate.Options{Model: o.Model, Window: w, GPU: gpu, Windows: calibrate.DefaultWindows,
		Fit: calibrate.FitOptions{Seed: o.Seed}}
	if o.MaxNumSeqs > 0 {
		co.Base.VLLM.MaxNumSeqs = o.MaxNumSeqs
	}
	co.Base.VLLM.Version = o.VLLMVersion // checked by buildPlan
	if po.Journal != "" {
		if co.Workload, err = calibrate.FromJournal(po.Journal); err != nil {
			return nil, err
		}
	}
	return planner.SolveObserved(ctx, p, planner.ObservedOptions{Source: src, Calibrate: co, Replicas: extra, Tolerance: po.Tolerance})
}
