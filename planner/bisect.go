package planner

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/lm-warden/warden/sim"
)

// capLevel bounds the search upwards: when a candidate's chosen routing
// still meets the targets at the highest sessions level, the bisection
// tries up to one more step of the sweep (the highest level plus its
// distance to the one below; twice it when there is one level) before it
// says "at least".
func capLevel(sessions []int) int {
	top := sessions[len(sessions)-1]
	gap := top
	if len(sessions) > 1 {
		gap = top - sessions[len(sessions)-2]
	}
	return min(top+gap, maxSessionsLevel)
}

// bisector is the search for one candidate's capacity with its chosen
// routing: lo meets (band verdict), hi misses (0: not found yet; the next
// probe is the cap).
type bisector struct {
	cand int
	// warm are the sweep's levels up to the last that meets: every probe
	// runs them first, then its own level, as if that were the sweep's next.
	warm   []int
	lo, hi int
	cap    int
	probes map[int]Band

	// The probe of the round under way: its level, its rows (one per run
	// of the band, in variants order; those not run are zero), which of
	// them the sweep's runs gave (aheadRows: not to run again) and whether
	// its verdict is known.
	n       int
	rows    []sim.Row
	have    []bool
	decided bool
}

// steps is the number of steps a run of the probe under way simulates:
// the warm-up levels and its own, or, with a trace, its own alone.
func (b *bisector) steps(trace *sim.Trace) int {
	if trace != nil {
		return 1
	}
	return len(b.warm) + 1
}

// firstStage marks the runs of a band (vs, nominal first) that a probe runs
// first: the nominal run, which tells marginal from misses, and every seed
// at the pessimistic corner (the smallest KV scale with the slowest speed
// simulated), where a farm near its cliff misses first. When none of them
// misses a target at the pessimistic edge, the other runs decide the
// probe; when one does, the probe misses whatever the others give, and its
// band holds the first stage's runs only (Band.Runs says how many; its
// Misses name a run that misses, the worst of those run). Probes that meet
// always hold every run, as the sweep's levels do. With Plan.fullBand
// (tests) the first stage is every run.
func (p Plan) firstStage(vs []variant) []bool {
	kv, speed := vs[0].kvScale, vs[0].speedScale
	for _, v := range vs {
		kv, speed = min(kv, v.kvScale), min(speed, v.speedScale)
	}
	out := make([]bool, len(vs))
	for i, v := range vs {
		out[i] = p.fullBand || i == 0 || (v.kvScale == kv && v.speedScale == speed)
	}
	return out
}

// next is the next level to probe, or 0 when the search is over. Upwards
// (hi 0) the first probe is the cap itself: a probe that meets holds every
// run of the band, one that misses mostly only its first stage
// (firstStage), so a farm that still meets at the cap is done in one
// probe, and one that does not is bisected below it.
func (b *bisector) next() int {
	switch {
	case b.hi == 0 && b.lo < b.cap:
		return b.cap
	case b.hi == 0:
		return 0
	case b.hi-b.lo > 1:
		return (b.lo + b.hi) / 2
	}
	return 0
}

// bisect finds each fitting candidate's exact capacity with its chosen
// routing: between the last sweep level whose band meets the targets and
// the first that misses, or, when the highest level meets, upwards from it
// (capLevel first: when that misses, between the highest level and it). A probe at n
// sessions runs every run of the band through the sweep's levels up to the
// last that meets, then n, and keeps that last step: n is measured as if it
// had been the sweep's next level (near the cache cliff the figures depend
// on how long the farm has run, so a probe from cold would not compare with
// the sweep's levels). With a trace it runs n alone, as the sweep does. The
// candidates' searches run round by round, every probe of a round in
// parallel (in two stages, firstStage), so the result does not depend on
// the parallelism.
func (p Plan) bisect(ctx context.Context, res *Result, cands []*candFarms, trace *sim.Trace, prog *progress) error {
	capLevel := capLevel(res.Sessions)
	var bs []*bisector
	for ci := range res.Candidates {
		c := &res.Candidates[ci]
		if cands[ci] == nil || !c.Fits || c.Chosen < 0 || c.MaxSessions == 0 {
			continue
		}
		warm := res.Sessions[:Level(res.Sessions, c.MaxSessions)+1]
		b := &bisector{cand: ci, warm: warm, lo: c.MaxSessions, hi: c.FailsAt, cap: capLevel, probes: map[int]Band{}}
		if b.hi == 0 {
			c.MaxSessionsCap = capLevel
		}
		bs = append(bs, b)
	}
	step := time.Duration(p.Duration)
	type probe struct {
		b   *bisector
		run int
	}
	for {
		// A round: the next level of every search that goes on.
		var active []*bisector
		for _, b := range bs {
			if b.n = b.next(); b.n != 0 {
				b.rows, b.decided = make([]sim.Row, len(cands[b.cand].vs)), false
				b.have = p.aheadRows(res, b)
				active = append(active, b)
			}
		}
		if len(active) == 0 {
			break
		}
		// Two stages: the runs most likely to miss first (firstStage), the
		// others only for the probes those left undecided.
		for stage := range 2 {
			var probes []probe
			for _, b := range active {
				first := p.firstStage(cands[b.cand].vs)
				for v := range cands[b.cand].vs {
					if !b.decided && first[v] == (stage == 0) && !b.have[v] {
						probes = append(probes, probe{b, v})
					}
				}
			}
			per := make([]time.Duration, len(probes))
			for i, pr := range probes {
				per[i] = step * time.Duration(pr.b.steps(trace))
				res.skips.Steps += pr.b.steps(trace)
			}
			base := prog.add(per)
			run := func(ctx context.Context, i int) error {
				pr := probes[i]
				c := &res.Candidates[pr.b.cand]
				cfg := &c.Configs[c.Chosen]
				cf := cands[pr.b.cand]
				e, err := p.experiment(res, cf.farm(pr.run), cfg, nil, 0)
				if err != nil {
					return err
				}
				e.Seed = cf.vs[pr.run].seed
				e.Sessions = append(slices.Clone(pr.b.warm), pr.b.n)
				if trace != nil {
					e.Trace, e.ClosedLoop = trace, true
					e.Sessions = []int{pr.b.n}
				}
				prog.noteRun(c.Name+" (bisection)", cfg, cf.vs[pr.run], e.Sessions)
				if prog.f != nil {
					e.Progress = func(done, _ time.Duration) { prog.set(base+i, done) }
				}
				rep, err := sim.Run(ctx, e)
				if err != nil {
					return fmt.Errorf("%s, %s, %s, %d sessions: %w", c.Name, cfg.label(), runLabel(cf.vs[pr.run]), pr.b.n, err)
				}
				if len(rep.Rows) != len(e.Sessions) {
					return fmt.Errorf("%s, %s: the simulator returned %d rows for %d sessions levels", c.Name, cfg.label(), len(rep.Rows), len(e.Sessions))
				}
				// Each probe writes its own slot.
				pr.b.rows[pr.run] = rep.Rows[len(rep.Rows)-1]
				prog.set(base+i, per[i])
				return nil
			}
			if len(probes) > 0 {
				if err := forEach(ctx, len(probes), p.Parallelism, run); err != nil {
					return err
				}
			}
			for _, b := range active {
				if b.decided {
					continue
				}
				vs := cands[b.cand].vs
				first := p.firstStage(vs)
				var rows []sim.Row
				var done []variant
				for v := range vs {
					if first[v] || stage == 1 {
						rows, done = append(rows, b.rows[v]), append(done, vs[v])
					}
				}
				band := res.Targets.band(rows, done)
				if band.Verdict == VerdictMeets && len(done) < len(vs) {
					continue // the first stage meets: the others decide
				}
				b.decided = true
				res.skips.probeDecided(b, first, stage, trace)
				b.probes[b.n] = band
				if band.Verdict == VerdictMeets {
					b.lo = b.n
				} else {
					b.hi = b.n
				}
			}
		}
	}
	for _, b := range bs {
		c := &res.Candidates[b.cand]
		c.MaxSessions, c.FailsAt = b.lo, b.hi
		if band, ok := b.probes[b.hi]; ok {
			c.FailsAtMisses = band.Misses
		}
		c.Probes = nil
		for _, n := range slices.Sorted(maps.Keys(b.probes)) {
			c.Probes = append(c.Probes, b.probes[n])
		}
	}
	return nil
}
