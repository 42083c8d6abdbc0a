package planner

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/lm-warden/warden/internal/strictyaml"
)

// Headroom. Near a steep cache cliff one more session, or a few % of KV,
// flips the outcome, and a real farm has collapsed at a load the model said
// it held: a candidate meets the targets only if its band's pessimistic edge
// meets them at the wanted concurrency and at HeadroomLevel(concurrency,
// headroom) too (the plan's headroom, DefaultHeadroom unless it gives one).
// That level is one of the sessions levels simulated (withDefaults adds it
// as it adds the concurrency), so the sweep decides it; a candidate that
// meets at the concurrency but not there is marginal, and the bisection
// (bisect.go), which finds where the chosen routing stops meeting them, says
// where the cliff is: "meets up to 16, 17 misses". A headroom of 0 is the
// rule without it: the concurrency alone decides.

// DefaultHeadroom is the headroom of a plan that gives none: 20 %.
const DefaultHeadroom = 0.2

// MaxHeadroom bounds a plan's headroom (1000 %: ten times the load again).
const MaxHeadroom = 10

// Percent is a fraction written as a percentage: 0.2 is "20%" in a plan
// file (the % is required there, so that neither 0.2 nor 20 can be read
// as the other) and in JSON.
type Percent float64

// UnmarshalYAML reads "20%" (or "20 %", "12.5%").
func (p *Percent) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return strictyaml.Bad(n, "want a percentage such as 20%% (0%% for none)")
	}
	v, err := ParsePercent(n.Value)
	if err != nil {
		return strictyaml.Bad(n, "%v", err)
	}
	*p = Percent(v)
	return nil
}

// MarshalText writes the percentage, "20%".
func (p Percent) MarshalText() ([]byte, error) {
	return []byte(strconv.FormatFloat(100*float64(p), 'f', -1, 64) + "%"), nil
}

// UnmarshalText reads what MarshalText writes.
func (p *Percent) UnmarshalText(b []byte) error {
	v, err := ParsePercent(string(b))
	if err != nil {
		return err
	}
	*p = Percent(v)
	return nil
}

// ParsePercent reads a percentage that says so, "20%" or "12.5 %", as a
// fraction (0.2, 0.125). A bare number is refused: 0.2 could be meant as a
// fraction or as 0.2 %.
func ParsePercent(s string) (float64, error) {
	t, ok := strings.CutSuffix(strings.TrimSpace(s), "%")
	if !ok {
		return 0, fmt.Errorf("%q: want a percentage with its %% sign, such as 20%% (0%% for none)", s)
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(t), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%q: want a percentage such as 20%% (0%% for none)", s)
	}
	return v / 100, nil
}

// HeadroomOf returns a plan's Headroom field for a fraction (0.2: 20 %).
func HeadroomOf(fraction float64) *Percent {
	p := Percent(fraction)
	return &p
}

// headroom is the plan's headroom as a fraction (DefaultHeadroom when
// unset).
func (p Plan) headroom() float64 {
	if p.Headroom == nil {
		return DefaultHeadroom
	}
	return float64(*p.Headroom)
}

// HeadroomLevel is the sessions level a candidate must also meet the
// targets at: ceil(n x (1 + h)), at least n+1; 0 when h is 0 (no headroom).
// The product is taken a hair down before rounding up, so that 10 x 1.2
// (12.000000000000002 in floating point) is 12, not 13.
func HeadroomLevel(n int, h float64) int {
	if !(h > 0) || n <= 0 {
		return 0
	}
	x := float64(n) * (1 + h)
	return max(int(math.Ceil(x-1e-9*x)), n+1)
}

// checkHeadroom validates the headroom and its level.
func (p Plan) checkHeadroom() error {
	h := p.headroom()
	if !(h >= 0 && h <= MaxHeadroom) {
		return bad("headroom", "want a percentage from 0%% (none) to %g%%, got %s%%", 100*float64(MaxHeadroom), strconv.FormatFloat(100*h, 'f', -1, 64))
	}
	if l := HeadroomLevel(p.Concurrency, h); l > maxSessionsLevel {
		return bad("headroom", "%s%% over %d concurrent sessions is %d, over the highest sessions level (%d)",
			strconv.FormatFloat(100*h, 'f', -1, 64), p.Concurrency, l, maxSessionsLevel)
	}
	return nil
}

// withHeadroom is " with 20 % headroom: at 16 and at 20 sessions" (meets)
// or " with 20 % headroom (at 16 and at 20 sessions)"; "" without headroom.
func (res *Result) withHeadroom(colon bool) string {
	if res.HeadroomSessions == 0 {
		return ""
	}
	if colon {
		return fmt.Sprintf(" with %s %% headroom: at %d and at %d sessions", pct(res.Headroom), res.Concurrency, res.HeadroomSessions)
	}
	return fmt.Sprintf(" with %s %% headroom (at %d and at %d sessions)", pct(res.Headroom), res.Concurrency, res.HeadroomSessions)
}

// configVerdict is a routing's verdict for the candidate: its band's at
// level index at, demoted from meets to marginal when the band at the
// headroom level hat (-1: none) does not meet the targets.
func configVerdict(cfg *Config, at, hat int) string {
	v := cfg.Bands[at].Verdict
	if v == VerdictMeets && hat >= 0 && cfg.Bands[hat].Verdict != VerdictMeets {
		return VerdictMarginal
	}
	return v
}

// cliffWhy says why a candidate that meets the targets at the wanted
// concurrency is marginal for want of headroom, with where its cliff is
// when the bisection found it between the two levels: "meets the targets
// at 16 sessions but not with 20 % headroom (20 sessions): at the cliff it
// meets up to 16, 17 misses TTFB p95 <= 10 s (15.42 s) if the engine is
// 20 % slower than the roofline's defaults".
func (res *Result) cliffWhy(c *Candidate, hat int) string {
	s := fmt.Sprintf("meets the targets at %d sessions but not with %s %% headroom (%d sessions)",
		res.Concurrency, pct(res.Headroom), res.HeadroomSessions)
	if c.MaxSessions >= res.Concurrency && c.FailsAt > c.MaxSessions && c.FailsAt <= res.HeadroomSessions && len(c.FailsAtMisses) > 0 {
		return s + fmt.Sprintf(": at the cliff it meets up to %d, %d misses %s", c.MaxSessions, c.FailsAt, res.BandMisses(c.FailsAtMisses))
	}
	return s + fmt.Sprintf(": at %d it misses %s", res.HeadroomSessions, res.BandMisses(c.Configs[c.Chosen].Bands[hat].Misses))
}

// BandMisses says which targets a band misses and in which run, e.g.
// "prefix hit >= 75 % (42.4 %) if the KV cache is 15 % smaller than
// estimated and the engine 20 % slower than the roofline's defaults, with
// other sessions (seed 3)"; the misses of one KV size and speed are said
// together.
func (res *Result) BandMisses(ms []BandMiss) string {
	return res.Targets.missesPhrase(ms, res.Seed)
}
