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
	stride int // upwards (hi 0): the next probe is lo + stride, doubled after each that meets
	probes map[int]Band
}

// next is the next level to probe, or 0 when the search is over.
func (b *bisector) next() int {
	switch {
	case b.hi == 0 && b.lo < b.cap:
		return min(b.lo+b.stride, b.cap)
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
// (one session more, then two, four, ... until one misses, at most
// capLevel) and then between the last that met and that one. A probe at n
// sessions runs every run of the band through the sweep's levels up to the
// last that meets, then n, and keeps that last step: n is measured as if it
// had been the sweep's next level (near the cache cliff the figures depend
// on how long the farm has run, so a probe from cold would not compare with
// the sweep's levels). With a trace it runs n alone, as the sweep does. The
// candidates' searches run round by round, every probe of a round in
// parallel, so the result does not depend on the parallelism.
func (p Plan) bisect(ctx context.Context, res *Result, cands []*candFarms, trace *sim.Trace, prog *progress) error {
	capLevel := capLevel(res.Sessions)
	var bs []*bisector
	for ci := range res.Candidates {
		c := &res.Candidates[ci]
		if !c.Fits || c.Chosen < 0 || c.MaxSessions == 0 {
			continue
		}
		warm := res.Sessions[:Level(res.Sessions, c.MaxSessions)+1]
		b := &bisector{cand: ci, warm: warm, lo: c.MaxSessions, hi: c.FailsAt, cap: capLevel, stride: 1, probes: map[int]Band{}}
		if b.hi == 0 {
			c.MaxSessionsCap = capLevel
		}
		bs = append(bs, b)
	}
	step := time.Duration(p.Duration)
	for {
		type probe struct {
			b     *bisector
			level int
			run   int
		}
		var probes []probe
		for _, b := range bs {
			n := b.next()
			if n == 0 {
				continue
			}
			for v := range cands[b.cand].vs {
				probes = append(probes, probe{b, n, v})
			}
		}
		if len(probes) == 0 {
			break
		}
		rows := make([]sim.Row, len(probes))
		per := make([]time.Duration, len(probes))
		for i, pr := range probes {
			per[i] = step * time.Duration(len(pr.b.warm)+1)
			if trace != nil {
				per[i] = step
			}
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
			e.Sessions = append(slices.Clone(pr.b.warm), pr.level)
			if trace != nil {
				e.Trace, e.ClosedLoop = trace, true
				e.Sessions = []int{pr.level}
			}
			if prog.f != nil {
				e.Progress = func(done, _ time.Duration) { prog.set(base+i, done) }
			}
			rep, err := sim.Run(ctx, e)
			if err != nil {
				return fmt.Errorf("%s, %s, %s, %d sessions: %w", c.Name, cfg.label(), runLabel(cf.vs[pr.run]), pr.level, err)
			}
			if len(rep.Rows) != len(e.Sessions) {
				return fmt.Errorf("%s, %s: the simulator returned %d rows for %d sessions levels", c.Name, cfg.label(), len(rep.Rows), len(e.Sessions))
			}
			rows[i] = rep.Rows[len(rep.Rows)-1]
			prog.set(base+i, per[i])
			return nil
		}
		if err := forEach(ctx, len(probes), p.Parallelism, run); err != nil {
			return err
		}
		for i := 0; i < len(probes); {
			b, n := probes[i].b, probes[i].level
			k := len(cands[b.cand].vs)
			band := res.Targets.band(rows[i:i+k], cands[b.cand].vs)
			b.probes[n] = band
			if band.Verdict == VerdictMeets {
				b.lo = n
				b.stride *= 2
			} else {
				b.hi = n
			}
			i += k
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
