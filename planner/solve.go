package planner

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lm-warden/warden/hardware"
	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/sim"
)

// Solve answers a plan: it expands the candidate farms, simulates every
// candidate that fits with every strategy and spill threshold at every
// sessions level, checks the targets on each step, and picks the cheapest
// candidate that meets them at the wanted concurrency (or, when none does,
// the closest one).
//
// The simulations run in parallel, at most Plan.Parallelism (GOMAXPROCS) at
// a time; the result does not depend on the order in which they finish.
// Solve returns ctx's error when ctx is done before it finishes, and the
// first failing simulation's error (in candidate order) otherwise.
func Solve(ctx context.Context, p Plan) (*Result, error) {
	p = p.withDefaults()
	if err := p.check(true); err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	var trace *sim.Trace
	if p.Workload.Trace != "" {
		t, err := sim.LoadTrace(p.Workload.Trace)
		if err != nil {
			return nil, fmt.Errorf("plan: workload.trace: %w", err)
		}
		if len(t.Requests) == 0 {
			return nil, fmt.Errorf("plan: workload.trace: %s holds no request", p.Workload.Trace)
		}
		trace = t
	}
	res := &Result{
		Kind:        Kind,
		Concurrency: p.Concurrency,
		Headroom:    p.headroom(),
		Sessions:    p.Sessions,
		DurationS:   time.Duration(p.Duration).Seconds(),
		Seed:        p.Seed,
		Strategies:  p.Strategies,
		Spills:      p.SpillThresholds,
		Targets:     p.Targets,
		Workload:    describeWorkload(p, trace),
		CostUnit:    "cards",
		Best:        -1,
		Closest:     -1,
	}
	prices, used, err := p.resolvePrices()
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	p.prices = prices
	if len(used) > 0 {
		res.CostUnit, res.Prices = "per hour", used
	}
	for k := range BandSeeds {
		res.Band.Seeds = append(res.Band.Seeds, p.Seed+uint64(k))
	}
	cands, err := p.expand(res)
	if err != nil {
		return nil, err
	}
	for _, c := range res.Candidates {
		if c.VLLMRelease != "" && !slices.Contains(res.VLLMReleases, c.VLLMRelease) {
			res.VLLMReleases = append(res.VLLMReleases, c.VLLMRelease)
		}
	}
	res.HeadroomSessions = HeadroomLevel(p.Concurrency, res.Headroom)
	res.Band.KVScales, res.Band.SpeedScales = BandKVScales[:1], BandSpeedScales[:1]
	for _, c := range res.Candidates {
		if c.Fits && c.KVBand {
			res.Band.KVScales = slices.Clone(BandKVScales)
		}
		if c.Fits && c.SpeedBand {
			res.Band.SpeedScales = slices.Clone(BandSpeedScales)
		}
	}
	farms := make([]*sim.Farm, len(cands))
	for i, cf := range cands {
		if cf != nil {
			farms[i] = cf.farms[0]
		}
	}
	prog := &progress{f: p.Progress, note: p.Note}
	for _, tier := range p.tiers(res, cands) {
		if err := p.simulate(ctx, res, tier, trace, prog); err != nil {
			return nil, err
		}
		res.decideConfigs()
		if err := p.bisect(ctx, res, tier, trace, prog); err != nil {
			return nil, err
		}
		if res.dearerNotSimulated(cands) {
			break
		}
	}
	res.explain()
	for i := range res.Candidates {
		res.Candidates[i].Reconcile = reconcile(res, &res.Candidates[i], p)
	}
	res.pick()
	res.RoutingCards = res.routingCards()
	res.BuyerCheck = buyerCheck(p, res)
	if err := p.timeline(ctx, res, farms, trace); err != nil {
		return nil, err
	}
	res.Question = question(res)
	res.Answer = answer(res)
	if w := res.RuleOfThumbWords(); w != "" {
		// The JSON, warden report --from and the terminal say the same.
		res.Answer += " " + w
	}
	res.Title = p.title()
	res.finishSkips()
	// What Solve returns is what its JSON says, to the last digit: a saved
	// result renders the same report as a fresh one.
	return roundTrip(res)
}

// candFarms are the resolved farms of one candidate: one per pair of KV
// scale and speed scale of its band (farms[0] the nominal one; only that
// one when the candidate has neither axis), and the band's runs.
type candFarms struct {
	farms []*sim.Farm
	vs    []variant
}

// farm is the farm of run v.
func (cf *candFarms) farm(v int) *sim.Farm { return cf.farms[cf.vs[v].farm] }

// expand fills res.Candidates, in plan order, and returns the resolved farms
// of each (nil for one whose model does not fit).
func (p Plan) expand(res *Result) ([]*candFarms, error) {
	var farms []*candFarms
	for i, set := range p.Farms {
		for gi, gpuName := range set.GPUs {
			gpu, err := hardware.LookupGPU(gpuName)
			if err != nil {
				return nil, fmt.Errorf("plan: farms[%d].gpus[%d]: %w", i, gi, err)
			}
			for _, tp := range set.TensorParallelSizes {
				for _, n := range set.Replicas {
					spec := set.spec(gpuName, n, tp)
					c, farm, err := p.candidate(spec, gpu, res.Workload.TypicalContextTokens)
					if err != nil {
						return nil, fmt.Errorf("plan: farms[%d]: %w", i, err)
					}
					res.Candidates = append(res.Candidates, c)
					farms = append(farms, farm)
				}
			}
		}
	}
	multiModel := false
	for _, c := range res.Candidates {
		multiModel = multiModel || c.Model != res.Candidates[0].Model
	}
	for i := range res.Candidates {
		c := &res.Candidates[i]
		c.Name = candidateName(c, multiModel)
	}
	return farms, nil
}

// candidate resolves one farm, at each KV scale of the band. A model that
// does not fit gives a candidate with Fits false and the reason; any other
// resolution error is the plan's.
func (p Plan) candidate(spec sim.FarmSpec, gpu hardware.GPU, context int) (Candidate, *candFarms, error) {
	c := Candidate{
		GPU:                gpu.Name,
		Model:              spec.Model,
		Replicas:           spec.Replicas,
		TensorParallelSize: spec.TensorParallelSize,
		Cards:              spec.Replicas * spec.TensorParallelSize,
		Chosen:             -1,
	}
	c.Cost = float64(c.Cards)
	if price, ok := p.prices[gpu.Name]; ok {
		c.Cost = price * float64(c.Cards)
		cost := c.Cost
		c.CostPerHour = &cost
	}
	// The same spec with a KV cache forced to exist: if that resolves, the
	// real spec fails only for want of memory.
	probe := spec
	probe.VLLM.NumGPUBlocks = max(probe.VLLM.NumGPUBlocks, 2)
	pf, err := sim.Resolve(probe)
	if err != nil {
		return c, nil, err
	}
	c.Model = pf.Model.Name
	c.MaxNumSeqs = pf.Spec.VLLM.MaxNumSeqs
	c.VLLMRelease = sim.VLLMRelease(pf.Behaviour.Version)
	farm, err := sim.Resolve(spec)
	if err != nil {
		c.Error = strings.TrimPrefix(err.Error(), "gpu: ")
		return c, nil, nil
	}
	c.Fits = true
	c.NumGPUBlocks = farm.NumGPUBlocks
	// The figure vLLM logs and `warden kv` prints: blocks x block size.
	kvTotal := func(f *sim.Farm) int64 {
		return int64(f.NumGPUBlocks) * int64(f.Spec.VLLM.BlockSize) * int64(c.Replicas)
	}
	c.KVTokensPerReplica = farm.NumGPUBlocks * farm.Spec.VLLM.BlockSize
	c.KVTokensTotal = kvTotal(farm)
	c.RuleOfThumb = hardware.RuleOfThumb(p.Concurrency, context, int(min(c.KVTokensTotal, int64(maxInt))))
	c.KVBand = spec.VLLM.NumGPUBlocks == 0
	c.SpeedBand = !Calibrated(spec.StepTime)
	nominal := sim.Float(c.KVTokensTotal)
	c.KVTokensTotalBand = Range{Low: nominal, Nominal: nominal, High: nominal}
	cf := &candFarms{vs: variants(p.Seed, c.KVBand, c.SpeedBand)}
	for _, v := range cf.vs {
		if v.farm < len(cf.farms) {
			continue // resolved for an earlier seed
		}
		if v.kvScale == 1 && v.speedScale == 1 {
			cf.farms = append(cf.farms, farm)
			continue
		}
		s := spec
		s.KVCapacityScale, s.SpeedScale = v.kvScale, v.speedScale
		f, err := sim.Resolve(s)
		if err != nil {
			return c, nil, fmt.Errorf("%s at %s: %w", c.GPU, pointLabel(v), err)
		}
		cf.farms = append(cf.farms, f)
		k := sim.Float(kvTotal(f))
		c.KVTokensTotalBand.Low = min(c.KVTokensTotalBand.Low, k)
		c.KVTokensTotalBand.High = max(c.KVTokensTotalBand.High, k)
	}
	return c, cf, nil
}

const maxInt = int(^uint(0) >> 1)

// plural is one for n == 1, else many.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// candidateName is "3 x RTX A4000", "8 x H100 SXM (2 replicas at TP 4)",
// with the model appended when the plan has several.
func candidateName(c *Candidate, withModel bool) string {
	name := fmt.Sprintf("%d x %s", c.Cards, c.GPU)
	if c.TensorParallelSize > 1 {
		name += fmt.Sprintf(" (%d %s at TP %d)", c.Replicas, plural(c.Replicas, "replica", "replicas"), c.TensorParallelSize)
	}
	if withModel {
		name += ", " + c.Model
	}
	return name
}

// job is one simulation: one candidate, one config, one run of the band,
// and either the sessions levels Sessions[:upTo] in a row (synthetic load,
// level -1) or one level (trace). With ahead > 0 the run goes on from
// Sessions[upTo-1] to ahead sessions, one more step (skip.go: the
// bisection's first probe).
type job struct {
	cand, cfg, run int
	level          int // index in Result.Sessions, or -1 for Sessions[:upTo]
	upTo           int
	ahead          int
}

// simulate runs the sweep and fills each fitting candidate's Configs (Rows:
// the nominal run; runs: every run of the band). It runs in two phases,
// which skip only what cannot change a verdict: first the nominal run of
// every config, over every level; then the band's other runs, each over
// the levels up to the highest at which the nominal run meets every target
// (Config.banded). Above it the verdict is already decided (misses: the
// band's pessimistic edge is never better than the nominal run), so those
// levels, and every level of a config whose nominal run meets nowhere, keep
// the nominal run alone (Band.Runs 1, and the reports say so). The band's
// other runs of a config whose nominal run meets at the highest level go on
// to the bisection's first probe (aheadLevel), which then takes their last
// step instead of simulating their warm-up again.
func (p Plan) simulate(ctx context.Context, res *Result, cands []*candFarms, trace *sim.Trace, prog *progress) error {
	configs := p.configs()
	// levels are the jobs of one run over Sessions[:upTo].
	levels := func(ci, k, v, upTo int) []job {
		if trace == nil {
			return []job{{cand: ci, cfg: k, run: v, level: -1, upTo: upTo}}
		}
		var out []job
		for l := range upTo {
			out = append(out, job{cand: ci, cfg: k, run: v, level: l})
		}
		return out
	}
	var jobs []job
	for ci, cf := range cands {
		if cf == nil {
			continue
		}
		c := &res.Candidates[ci]
		c.Configs = make([]Config, len(configs))
		for k, cfg := range configs {
			c.Configs[k] = Config{Strategy: cfg.Strategy, Spill: cfg.Spill, vs: cf.vs, runs: make([][]sim.Row, len(cf.vs))}
			for v := range cf.vs {
				c.Configs[k].runs[v] = make([]sim.Row, len(res.Sessions))
			}
			jobs = append(jobs, levels(ci, k, 0, len(res.Sessions))...)
		}
	}
	if err := p.runJobs(ctx, res, cands, trace, prog, jobs); err != nil {
		return err
	}
	res.skips.count(jobs)
	ahead := p.aheadLevel(res.Sessions, trace)
	jobs = nil
	for ci, cf := range cands {
		if cf == nil {
			continue
		}
		for k := range res.Candidates[ci].Configs {
			cfg := &res.Candidates[ci].Configs[k]
			cfg.Rows = cfg.runs[0]
			cfg.banded = 0
			for l := range cfg.Rows {
				if p.fullBand || res.Targets.check(&cfg.Rows[l]).Meets {
					cfg.banded = l + 1
				}
			}
			res.skips.NominalOnly += (len(cf.vs) - 1) * (len(cfg.Rows) - cfg.banded)
			if cfg.banded == 0 || len(cf.vs) == 1 {
				continue
			}
			goOn := ahead > 0 && cfg.banded == len(res.Sessions)
			if goOn {
				cfg.aheadAt, cfg.ahead = ahead, make([]sim.Row, len(cf.vs))
			}
			for v := 1; v < len(cf.vs); v++ {
				js := levels(ci, k, v, cfg.banded)
				if goOn {
					js[0].ahead = ahead
				}
				jobs = append(jobs, js...)
			}
		}
	}
	if err := p.runJobs(ctx, res, cands, trace, prog, jobs); err != nil {
		return err
	}
	res.skips.count(jobs)
	return nil
}

// runJobs runs jobs in parallel; each writes its rows into its config's
// runs.
func (p Plan) runJobs(ctx context.Context, res *Result, cands []*candFarms, trace *sim.Trace, prog *progress, jobs []job) error {
	if len(jobs) == 0 {
		return nil
	}
	step := time.Duration(p.Duration)
	per := make([]time.Duration, len(jobs))
	for i, j := range jobs {
		per[i] = step * time.Duration(j.steps())
	}
	base := prog.add(per)

	run := func(ctx context.Context, i int) error {
		j := jobs[i]
		c := &res.Candidates[j.cand]
		cfg := &c.Configs[j.cfg]
		cf := cands[j.cand]
		e, err := p.experiment(res, cf.farm(j.run), cfg, trace, j.level)
		if err != nil {
			return err
		}
		if j.level < 0 {
			e.Sessions = res.Sessions[:j.upTo]
			if j.ahead > 0 {
				e.Sessions = append(slices.Clone(e.Sessions), j.ahead)
			}
		}
		e.Seed = cf.vs[j.run].seed
		prog.noteRun(c.Name, cfg, cf.vs[j.run], e.Sessions)
		if prog.f != nil {
			e.Progress = func(done, _ time.Duration) { prog.set(base+i, done) }
		}
		rep, err := sim.Run(ctx, e)
		if err != nil {
			return fmt.Errorf("%s, %s, %s: %w", c.Name, cfg.label(), runLabel(cf.vs[j.run]), err)
		}
		if len(rep.Rows) != len(e.Sessions) {
			return fmt.Errorf("%s, %s: the simulator returned %d rows for %d sessions levels", c.Name, cfg.label(), len(rep.Rows), len(e.Sessions))
		}
		// Each job writes its own rows: no two jobs share a slot.
		rows := rep.Rows
		if j.ahead > 0 {
			rows, cfg.ahead[j.run] = rows[:len(rows)-1], rows[len(rows)-1]
		}
		copy(cfg.runs[j.run][max(j.level, 0):], rows)
		prog.set(base+i, per[i])
		return nil
	}
	return forEach(ctx, len(jobs), p.Parallelism, run)
}

// runLabel names a run of the band in errors, e.g. "KV x0.85, speed x0.8,
// seed 2".
func runLabel(v variant) string {
	return fmt.Sprintf("%s, seed %d", pointLabel(v), v.seed)
}

// pointLabel is a run's KV and speed scales, "KV x0.85, speed x0.8".
func pointLabel(v variant) string {
	return fmt.Sprintf("KV x%g, speed x%g", v.kvScale, v.speedScale)
}

// experiment is the simulation of one config of one farm: every sessions
// level in a row (synthetic load), or, with a trace, level alone.
func (p Plan) experiment(res *Result, farm *sim.Farm, cfg *Config, trace *sim.Trace, level int) (sim.Experiment, error) {
	e := sim.Experiment{
		Farm:       farm,
		Strategies: []string{cfg.Strategy},
		Workload:   p.Workload.Workload,
		Sessions:   res.Sessions,
		Duration:   time.Duration(p.Duration),
		Seed:       p.Seed,
	}
	if cfg.Spill != "" {
		spill, err := placement.ParseSpillThreshold(cfg.Spill)
		if err != nil {
			return e, err
		}
		e.Spill = &spill
	}
	if trace != nil {
		e.Trace, e.ClosedLoop = trace, true
		e.Sessions = res.Sessions[level : level+1]
	}
	return e, nil
}

// forEach calls f(ctx, i) for every i in [0, n), at most par at a time
// (GOMAXPROCS when par <= 0). The first error cancels the others' ctx; the
// error returned is ctx's own when it was done first, else the error of the
// lowest i that failed for a reason of its own.
func forEach(ctx context.Context, n, par int, f func(ctx context.Context, i int) error) error {
	if par <= 0 {
		par = runtime.GOMAXPROCS(0)
	}
	par = min(par, n)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	errs := make([]error, n)
	next := make(chan int)
	var wg sync.WaitGroup
	for range par {
		wg.Go(func() {
			for i := range next {
				if err := f(ctx, i); err != nil {
					errs[i] = err
					cancel(err)
				}
			}
		})
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err := ctx.Err(); err != nil && context.Cause(ctx) == err {
		// Done from outside (the parent), not by a failing f.
		return err
	}
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// progress sums the simulated time done by every job; the sweep's jobs and
// then each bisection round's are added as they are known (total grows).
type progress struct {
	mu    sync.Mutex
	f     func(done, total time.Duration)
	note  func(what string)
	done  []time.Duration
	per   []time.Duration
	sum   time.Duration
	total time.Duration
}

// add adds jobs of the given lengths and returns the index of the first.
func (p *progress) add(per []time.Duration) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	base := len(p.per)
	p.per = append(p.per, per...)
	p.done = append(p.done, make([]time.Duration, len(per))...)
	for _, d := range per {
		p.total += d
	}
	return base
}

func (p *progress) set(i int, d time.Duration) {
	if p.f == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	d = min(d, p.per[i])
	if d <= p.done[i] {
		return
	}
	p.sum += d - p.done[i]
	p.done[i] = d
	p.f(p.sum, p.total)
}

// noteRun tells Plan.Note that a run of candidate cand starts: its
// routing, its member of the band and its sessions levels.
func (p *progress) noteRun(cand string, cfg *Config, v variant, sessions []int) {
	if p.note == nil || len(sessions) == 0 {
		return
	}
	levels := strconv.Itoa(sessions[0])
	if n := len(sessions); n > 1 {
		levels += "-" + strconv.Itoa(sessions[n-1])
	}
	p.note(fmt.Sprintf("%s, %s, %s, %s sessions", cand, cfg.label(), runLabel(v), levels))
}

// configs lists the routings to try: each strategy once, affinity and its
// variants (placement.ParseSpec: affinity+kv, +admit, ...) once per spill
// threshold (placement.Strategy.Spills), except a priced variant, whose
// spill is priced.
func (p Plan) configs() []Config {
	var out []Config
	for _, s := range p.Strategies {
		v, err := placement.ParseSpec(s)
		st, _ := placement.LookupStrategy(v.Strategy)
		if err != nil || !st.Spills || v.Priced {
			out = append(out, Config{Strategy: s})
			continue
		}
		for _, t := range p.SpillThresholds {
			out = append(out, Config{Strategy: s, Spill: t})
		}
	}
	return out
}

// label is the strategy's name as the simulator's tables give it, with the
// spill threshold: "least-loaded", "affinity (spill auto)", "affinity (kv,
// admit, spill auto)", "affinity (kv, priced, admit)".
func (c *Config) label() string {
	name := placement.SpecLabel(c.Strategy)
	switch {
	case c.Spill == "":
		return name
	case strings.HasSuffix(name, ")"):
		return name[:len(name)-1] + ", spill " + c.Spill + ")"
	default:
		return name + " (spill " + c.Spill + ")"
	}
}

// Label names the routing as the report and the answer do, e.g.
// "affinity (spill auto)", "affinity (kv, admit, spill auto)" or
// "least-loaded".
func (c Config) Label() string { return c.label() }

// Level returns the index of a sessions level in sessions, or -1.
func Level(sessions []int, n int) int { return slices.Index(sessions, n) }
