package traces

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/lm-warden/warden/internal/strictyaml"
)

// Shapes of a Dist.
const (
	DistConstant    = "constant"    // always Mean
	DistLognormal   = "lognormal"   // exp(mu + sigma Z), mean Mean
	DistExponential = "exponential" // mean Mean
	DistUniform     = "uniform"     // uniform in [Min, Max]
)

// Dist is the distribution of a non-negative quantity of a workload: a
// number of tokens or subagents (TokenDist) or a pause (TimeDist). In YAML
// it is a plain value (a constant: 1800, or 30s) or a mapping:
//
//	{mean: 1800, sigma: 1.4, max: 40000}   # lognormal when sigma > 0
//	{dist: exponential, mean: 30s, max: 10m}
//	{dist: uniform, min: 2, max: 6}
//
// dist is constant, lognormal, exponential or uniform; left out, it is
// lognormal when sigma > 0 and constant otherwise. A lognormal's sigma is
// that of the underlying normal (its median is mean x exp(-sigma^2/2); a
// sigma of 1.5 puts the 99th percentile ~30 times above the median: the
// heavy tail of tool results). min and max clip every draw (max 0: no
// bound); the mean is that of the distribution before clipping.
type Dist[U distUnit] struct {
	Shape string
	Mean  float64 // tokens, or seconds
	Sigma float64
	Min   float64
	Max   float64
}

// TokenDist is a Dist of tokens (or of a count: subagents, turns).
type TokenDist = Dist[tokenUnit]

// TimeDist is a Dist of a duration; its figures are in seconds.
type TimeDist = Dist[timeUnit]

// distUnit says how a Dist's values read and write.
type distUnit interface {
	parse(s string) (float64, error)
	format(v float64) string
	example() string
}

type tokenUnit struct{}

func (tokenUnit) parse(s string) (float64, error) {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a number", s)
	}
	return v, nil
}
func (tokenUnit) format(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
func (tokenUnit) example() string         { return "1800 or {mean: 1800, sigma: 1.4, max: 40000}" }

type timeUnit struct{}

func (timeUnit) parse(s string) (float64, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		if s == "0" {
			return 0, nil
		}
		return 0, fmt.Errorf("%q is not a duration (want e.g. 500ms, 30s, 5m)", s)
	}
	return d.Seconds(), nil
}
func (timeUnit) format(v float64) string {
	return time.Duration(math.Round(v * 1e9)).String()
}
func (timeUnit) example() string { return "30s or {mean: 30s, sigma: 1.2, max: 10m}" }

// Const returns the constant distribution of v.
func Const[U distUnit](v float64) Dist[U] { return Dist[U]{Mean: v} }

// IsZero reports a distribution left out (every field zero).
func (d Dist[U]) IsZero() bool { return d == Dist[U]{} }

// shape is Shape with its default filled in.
func (d Dist[U]) shape() string {
	switch {
	case d.Shape != "":
		return d.Shape
	case d.Sigma > 0:
		return DistLognormal
	}
	return DistConstant
}

// draw returns one value. Each shape takes a fixed number of draws from
// rng (none for a constant, one otherwise), so that a stream stays
// aligned whatever the values.
func (d Dist[U]) draw(rng *rand.Rand) float64 {
	var v float64
	switch d.shape() {
	case DistLognormal:
		mu := math.Log(d.Mean) - d.Sigma*d.Sigma/2
		v = math.Exp(mu + d.Sigma*rng.NormFloat64())
	case DistExponential:
		v = d.Mean * rng.ExpFloat64()
	case DistUniform:
		v = d.Min + (d.Max-d.Min)*rng.Float64()
	default:
		v = d.Mean
	}
	if v < d.Min {
		v = d.Min
	}
	if d.Max > 0 && v > d.Max {
		v = d.Max
	}
	return v
}

// drawInt is draw rounded to an integer of at least lo.
func (d Dist[U]) drawInt(rng *rand.Rand, lo int) int {
	v := math.Round(d.draw(rng))
	if v > math.MaxInt32 {
		return math.MaxInt32
	}
	return max(int(v), lo)
}

// drawDuration is draw as a duration.
func (d Dist[U]) drawDuration(rng *rand.Rand) time.Duration {
	return time.Duration(math.Round(d.draw(rng) * 1e9))
}

// Median is the distribution's median before clipping.
func (d Dist[U]) Median() float64 {
	switch d.shape() {
	case DistLognormal:
		return d.Mean * math.Exp(-d.Sigma*d.Sigma/2)
	case DistExponential:
		return d.Mean * math.Ln2
	case DistUniform:
		return (d.Min + d.Max) / 2
	}
	return d.Mean
}

// ClippedMean is the mean of the clipped distribution, computed
// numerically for a lognormal or exponential with bounds (the mean a
// simulation sees).
func (d Dist[U]) ClippedMean() float64 {
	switch d.shape() {
	case DistUniform:
		return (d.Min + d.Max) / 2
	case DistConstant:
		v := max(d.Mean, d.Min)
		if d.Max > 0 {
			v = min(v, d.Max)
		}
		return v
	}
	if d.Min <= 0 && d.Max <= 0 {
		return d.Mean
	}
	// E[clip(X)] by the midpoint rule over the quantiles of X.
	const n = 4000
	var sum float64
	for i := range n {
		p := (float64(i) + 0.5) / n
		var x float64
		if d.shape() == DistLognormal {
			mu := math.Log(d.Mean) - d.Sigma*d.Sigma/2
			x = math.Exp(mu + d.Sigma*math.Sqrt2*math.Erfinv(2*p-1))
		} else {
			x = -d.Mean * math.Log(1-p)
		}
		x = max(x, d.Min)
		if d.Max > 0 {
			x = min(x, d.Max)
		}
		sum += x
	}
	return sum / n
}

// check says why d is not a valid distribution ("" if it is). lo is the
// least value a constant may have (draws are raised to it).
func (d Dist[U]) check(lo float64) string {
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	if !finite(d.Mean) || !finite(d.Sigma) || !finite(d.Min) || !finite(d.Max) {
		return "every figure must be a finite number"
	}
	var u U
	switch d.shape() {
	case DistConstant, DistLognormal, DistExponential, DistUniform:
	default:
		return fmt.Sprintf("dist must be %s, %s, %s or %s, got %q", DistConstant, DistLognormal, DistExponential, DistUniform, d.Shape)
	}
	switch {
	case d.Min < 0:
		return fmt.Sprintf("min must be >= 0, got %s", u.format(d.Min))
	case d.Max < 0:
		return fmt.Sprintf("max must be >= 0 (0: no bound), got %s", u.format(d.Max))
	case d.Max > 0 && d.Max < d.Min:
		return fmt.Sprintf("max %s is below min %s", u.format(d.Max), u.format(d.Min))
	case d.Sigma < 0 || d.Sigma > 4:
		return fmt.Sprintf("sigma must be in [0, 4], got %g", d.Sigma)
	}
	switch d.shape() {
	case DistLognormal, DistExponential:
		if !(d.Mean > 0) {
			return fmt.Sprintf("a %s needs a mean > 0, got %s", d.shape(), u.format(d.Mean))
		}
	case DistUniform:
		if !(d.Max > 0) {
			return "a uniform needs max > 0 (and min)"
		}
	default:
		if d.Mean < lo {
			return fmt.Sprintf("must be >= %s, got %s", u.format(lo), u.format(d.Mean))
		}
	}
	if d.shape() != DistLognormal && d.Sigma != 0 {
		return fmt.Sprintf("sigma is for a lognormal, not a %s", d.shape())
	}
	return ""
}

// checkBounded is check with an upper bound hi on every draw: a
// distribution with a tail (lognormal, exponential) must say its max, as
// a real agent truncates what it reads, and nothing may pass hi.
func (d Dist[U]) checkBounded(lo, hi float64) string {
	if why := d.check(lo); why != "" {
		return why
	}
	var u U
	switch {
	case d.Mean > hi || d.Max > hi || d.Min > hi:
		return fmt.Sprintf("must stay within %s", u.format(hi))
	case (d.shape() == DistLognormal || d.shape() == DistExponential) && d.Max == 0:
		return fmt.Sprintf("a %s has a tail: give its max (what the agent truncates to)", d.shape())
	}
	return ""
}

// distYAML is the mapping form of a Dist.
type distYAML struct {
	Dist  string `yaml:"dist,omitempty"`
	Mean  string `yaml:"mean,omitempty"`
	Sigma string `yaml:"sigma,omitempty"`
	Min   string `yaml:"min,omitempty"`
	Max   string `yaml:"max,omitempty"`
}

// UnmarshalYAML reads a plain value or the mapping form.
func (d *Dist[U]) UnmarshalYAML(n *yaml.Node) error {
	var u U
	fail := func(format string, args ...any) error { return strictyaml.Bad(n, format, args...) }
	switch n.Kind {
	case yaml.ScalarNode:
		v, err := u.parse(n.Value)
		if err != nil {
			return fail("%v (want %s)", err, u.example())
		}
		*d = Dist[U]{Mean: v}
		return nil
	case yaml.MappingNode:
	default:
		return fail("want %s", u.example())
	}
	var m distYAML
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if v.Kind != yaml.ScalarNode {
			return fail("%s: want a plain value", k.Value)
		}
		switch k.Value {
		case "dist":
			m.Dist = v.Value
		case "mean":
			m.Mean = v.Value
		case "sigma":
			m.Sigma = v.Value
		case "min":
			m.Min = v.Value
		case "max":
			m.Max = v.Value
		default:
			return fail("%s: unknown key of a distribution (want dist, mean, sigma, min, max)", k.Value)
		}
	}
	out := Dist[U]{Shape: m.Dist}
	for _, f := range []struct {
		s   string
		dst *float64
	}{{m.Mean, &out.Mean}, {m.Min, &out.Min}, {m.Max, &out.Max}} {
		if f.s == "" {
			continue
		}
		v, err := u.parse(f.s)
		if err != nil {
			return fail("%v", err)
		}
		*f.dst = v
	}
	if m.Sigma != "" {
		v, err := strconv.ParseFloat(m.Sigma, 64)
		if err != nil {
			return fail("sigma %q is not a number", m.Sigma)
		}
		out.Sigma = v
	}
	*d = out
	return nil
}

// MarshalYAML writes a constant as a plain value, else the mapping form
// on one line: {mean: 1800, sigma: 1.4, max: 40000}.
func (d Dist[U]) MarshalYAML() (any, error) {
	var u U
	if d.Shape == "" && d.Sigma == 0 && d.Min == 0 && d.Max == 0 {
		if _, ok := any(u).(tokenUnit); ok {
			return d.Mean, nil
		}
		return u.format(d.Mean), nil
	}
	n := &yaml.Node{Kind: yaml.MappingNode, Style: yaml.FlowStyle}
	add := func(k, v string) {
		n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: k}, &yaml.Node{Kind: yaml.ScalarNode, Value: v})
	}
	for _, kv := range d.fields() {
		add(kv[0], kv[1])
	}
	return n, nil
}

// fields are the mapping form's keys and values, in order.
func (d Dist[U]) fields() [][2]string {
	var u U
	var out [][2]string
	if d.Shape != "" {
		out = append(out, [2]string{"dist", d.Shape})
	}
	if d.shape() != DistUniform || d.Mean != 0 {
		out = append(out, [2]string{"mean", u.format(d.Mean)})
	}
	if d.Sigma != 0 {
		out = append(out, [2]string{"sigma", strconv.FormatFloat(d.Sigma, 'f', -1, 64)})
	}
	if d.Min != 0 {
		out = append(out, [2]string{"min", u.format(d.Min)})
	}
	if d.Max != 0 {
		out = append(out, [2]string{"max", u.format(d.Max)})
	}
	return out
}

// MarshalJSON writes a constant as a number (tokens) or a duration
// string, else the mapping form, every figure in its unit's words
// (durations as "30s").
func (d Dist[U]) MarshalJSON() ([]byte, error) {
	var u U
	if d.Shape == "" && d.Sigma == 0 && d.Min == 0 && d.Max == 0 {
		if _, ok := any(u).(tokenUnit); ok {
			return json.Marshal(d.Mean)
		}
		return json.Marshal(u.format(d.Mean))
	}
	m := distYAML{}
	for _, kv := range d.fields() {
		switch kv[0] {
		case "dist":
			m.Dist = kv[1]
		case "mean":
			m.Mean = kv[1]
		case "sigma":
			m.Sigma = kv[1]
		case "min":
			m.Min = kv[1]
		case "max":
			m.Max = kv[1]
		}
	}
	return json.Marshal(struct {
		Dist  string `json:"dist,omitempty"`
		Mean  string `json:"mean,omitempty"`
		Sigma string `json:"sigma,omitempty"`
		Min   string `json:"min,omitempty"`
		Max   string `json:"max,omitempty"`
	}(m))
}

// UnmarshalJSON reads what MarshalJSON writes.
func (d *Dist[U]) UnmarshalJSON(b []byte) error {
	var n yaml.Node
	if err := yaml.Unmarshal(b, &n); err != nil {
		return err
	}
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		return d.UnmarshalYAML(n.Content[0])
	}
	return fmt.Errorf("not a distribution: %s", b)
}

// String writes the distribution in a few words: "1800", "lognormal mean
// 1800 sigma 1.4 max 40000".
func (d Dist[U]) String() string {
	var u U
	s := d.shape()
	if s == DistConstant && d.Min == 0 && d.Max == 0 {
		return u.format(d.Mean)
	}
	out := s
	if s != DistUniform {
		out += " mean " + u.format(d.Mean)
	}
	if d.Sigma != 0 {
		out += " sigma " + strconv.FormatFloat(d.Sigma, 'f', -1, 64)
	}
	if d.Min != 0 {
		out += " min " + u.format(d.Min)
	}
	if d.Max != 0 {
		out += " max " + u.format(d.Max)
	}
	return out
}
