package planner

import (
	"fmt"
	"strings"
	"time"

	"github.com/lm-warden/warden/sim"
)

// What a plan does not simulate, and what it simulates once for two uses.
// Every skip is exact: the result is the one every run of every band at
// every level and probe would give, byte for byte, less the runs a
// verdict already decided leaves out of the bands (Band.Runs says so), and
// less the candidates dearer than a farm that meets the targets, which
// cannot be the answer (tiers.go; Candidate.NotSimulated says so).
//
//   - Nominal only (solve.go's simulate): above the highest level at which
//     a routing's nominal run meets the targets, the band's other runs are
//     not simulated: the pessimistic edge is never better than the nominal
//     run, so the level misses whatever they give.
//   - First stage (bisect.go): a probe whose first stage (the nominal run
//     and the pessimistic corner's seeds) misses a target misses whatever
//     the other runs give; they are not simulated.
//   - Shared warm-ups: a probe at n sessions runs the sweep's levels up to
//     the last that meets, then n, and keeps that last step. When the
//     highest level meets, the bisection's first probe is at the cap
//     (capLevel) after every sweep level: exactly the sweep's run with one
//     more step. So the sweep's band runs of a routing whose nominal run
//     meets at the highest level go on to the cap (Config.ahead), and that
//     probe takes their last step instead of simulating their warm-up
//     again. A simulation's steps do not depend on the steps after them
//     (the load of a step is drawn as it runs; a step's figures are read
//     over its own window; only the last step's end cuts the requests in
//     flight, which changes no figure a band reads, only a row's
//     Unfinished, and the band runs' rows are not kept). The nominal run's
//     rows are the result's Rows, so it does not go on, and the probe
//     simulates it as before. A run that went on for a routing that is not
//     chosen, or whose band does not meet at the highest level, or whose
//     probe its first stage decided, was one step spent for nothing
//     (AheadUnused).
//
// Not done, because it could change an answer: skipping levels a smaller
// farm of the same card already decided (nothing in the simulator makes
// a farm with more replicas meet whatever a smaller one meets: affinity
// places by KV use and load, and a bigger farm spreads the same sessions
// thinner, so its caches hold less of each), and taking one KV scale's run
// for another's (the KV use the router scores changes with the cache's
// size even when no block is evicted).

// Skipped counts, in steps (one run of the band over one sessions level,
// Result.DurationS of farm time), the work of the sweep and the
// bisection: what was simulated, what was left out and why.
type Skipped struct {
	// Steps are the steps simulated by the sweep and the bisection,
	// warm-up steps and the steps run ahead included (the timeline's run
	// not).
	Steps int `json:"steps"`
	// NominalOnly are the band's steps left out at sweep levels where the
	// nominal run already misses a target.
	NominalOnly int `json:"nominal_only"`
	// FirstStage are the steps of the probe runs left out because the
	// probe's first stage already missed.
	FirstStage int `json:"first_stage"`
	// SharedWarmUps are the warm-up steps the bisection's first probe did
	// not simulate again: its band runs took the last step of the sweep's,
	// which went on to the cap.
	SharedWarmUps int `json:"shared_warm_ups"`
	// AheadUnused are the steps the sweep's runs went on to the cap that
	// no probe used.
	AheadUnused int `json:"ahead_unused"`
	// Candidates are the candidates not simulated because a cheaper one
	// meets the targets (tiers.go; Candidate.NotSimulated).
	Candidates int `json:"candidates,omitempty"`

	ahead, aheadUsed int // steps run ahead, and those a probe used
}

// aheadLevel is the level the sweep's band runs go on to: the
// bisection's first probe when the highest level meets (the cap), 0 for
// none (a trace's probe runs its level alone; Plan.noAhead, tests).
func (p Plan) aheadLevel(sessions []int, trace *sim.Trace) int {
	if trace != nil || p.noAhead || len(sessions) == 0 {
		return 0
	}
	if c := capLevel(sessions); c > sessions[len(sessions)-1] {
		return c
	}
	return 0
}

// steps is the number of steps job j simulates.
func (j job) steps() int {
	n := 1
	if j.level < 0 {
		n = j.upTo
	}
	if j.ahead > 0 {
		n++
	}
	return n
}

// count adds the steps of jobs.
func (s *Skipped) count(jobs []job) {
	for _, j := range jobs {
		s.Steps += j.steps()
		if j.ahead > 0 {
			s.ahead++
		}
	}
}

// aheadRows fills the rows of b's probe under way that the sweep's runs
// of its candidate's chosen routing went on to (when the probe is the one
// they went on to: the cap, after every sweep level) and says which.
func (p Plan) aheadRows(res *Result, b *bisector) []bool {
	have := make([]bool, len(b.rows))
	c := &res.Candidates[b.cand]
	cfg := &c.Configs[c.Chosen]
	if cfg.ahead == nil || cfg.aheadAt != b.n || len(b.warm) != len(res.Sessions) {
		return have
	}
	for v := 1; v < len(b.rows); v++ {
		b.rows[v], have[v] = cfg.ahead[v], true
	}
	return have
}

// probeDecided counts what the probe under way of b, decided after stage,
// left out and took from the sweep.
func (s *Skipped) probeDecided(b *bisector, first []bool, stage int, trace *sim.Trace) {
	for v := range b.rows {
		if stage == 0 && !first[v] {
			s.FirstStage += b.steps(trace)
			continue
		}
		if b.have[v] {
			s.SharedWarmUps += len(b.warm)
			s.aheadUsed++
		}
	}
}

// finishSkips sets res.Skipped from the counts.
func (res *Result) finishSkips() {
	s := res.skips
	s.AheadUnused = s.ahead - s.aheadUsed
	res.Skipped = &s
}

// SkipNote says in a sentence or two what the plan did not simulate and
// why, e.g. "Not simulated, as they could not change the answer: 312
// steps of band runs at levels the nominal run already misses, 46 steps
// of probes whose first stage missed. Simulated once for two uses: 520
// warm-up steps (the bisection's first probe took the last step of the
// sweep's runs, which went on to its level; 26 steps run on that way
// went unused). 1,234 steps of 1m0s simulated." "" for a result without
// the counts.
func (res *Result) SkipNote() string {
	s := res.Skipped
	if s == nil {
		return ""
	}
	var left []string
	if s.NominalOnly > 0 {
		left = append(left, fmt.Sprintf("%s of band runs at levels the nominal run already misses", stepsPhrase(s.NominalOnly)))
	}
	if s.FirstStage > 0 {
		left = append(left, fmt.Sprintf("%s of probes whose first stage (the nominal run and the pessimistic corner) already missed", stepsPhrase(s.FirstStage)))
	}
	var b strings.Builder
	if s.Candidates > 0 {
		fmt.Fprintf(&b, "Not simulated, as a farm dearer than one that meets the targets cannot be the answer: %s "+
			"(every_candidate: true in a plan file, or --every-candidate, simulates them). ", candidatesPhrase(s.Candidates))
	}
	if len(left) > 0 {
		fmt.Fprintf(&b, "Not simulated, as they could not change the answer: %s. ", joinAnd(left))
	}
	if s.SharedWarmUps > 0 {
		fmt.Fprintf(&b, "Not simulated twice: %s of warm-up (the bisection's first probe took the last step of the sweep's band runs, which went on to its level", stepsPhrase(s.SharedWarmUps))
		if s.AheadUnused > 0 {
			fmt.Fprintf(&b, "; %s run on that way went unused", stepsPhrase(s.AheadUnused))
		}
		b.WriteString("). ")
	} else if s.AheadUnused > 0 {
		fmt.Fprintf(&b, "%s run on to the bisection's first probe went unused. ", capitalize(stepsPhrase(s.AheadUnused)))
	}
	fmt.Fprintf(&b, "Simulated: %s of %s.", stepsPhrase(s.Steps), time.Duration(res.DurationS*float64(time.Second)))
	return b.String()
}

// candidatesPhrase is "1 candidate", "4 candidates".
func candidatesPhrase(n int) string {
	if n == 1 {
		return "1 candidate"
	}
	return group(int64(n)) + " candidates"
}

// stepsPhrase is "1 step", "1,234 steps".
func stepsPhrase(n int) string {
	if n == 1 {
		return "1 step"
	}
	return group(int64(n)) + " steps"
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
