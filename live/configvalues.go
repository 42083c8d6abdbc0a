package live

import (
	"math"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/lm-warden/warden/internal/strictyaml"
	"github.com/lm-warden/warden/placement"
)

// The YAML values of the configuration that are more than a string or a
// number: each reads itself and says what it wants when it is wrong.

// PrefillRate is a model's prefill_tokens_per_s: a fixed rate (PerS) or
// measured per replica (Metrics); neither when not given.
type PrefillRate struct {
	PerS    float64
	Metrics bool
}

// Set reports whether the key was given.
func (r PrefillRate) Set() bool { return r.Metrics || r.PerS > 0 }

// maxPrefillTokensPerS bounds a configured prefill rate: a thousand times
// what an H200 computes (about 10^5 tokens/s for a small model), so a
// typo'd exponent is refused rather than taken.
const maxPrefillTokensPerS = 1e8

// UnmarshalYAML implements yaml.Unmarshaler.
func (r *PrefillRate) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && n.Value == "metrics" {
		*r = PrefillRate{Metrics: true}
		return nil
	}
	v, err := strconv.ParseFloat(n.Value, 64)
	if n.Kind != yaml.ScalarNode || err != nil || !(v > 0) || v > maxPrefillTokensPerS {
		return strictyaml.Bad(n, "want a prefill rate in tokens per second (a number above 0, at most %g) or metrics (measured on each replica from vLLM's metrics), got %q", float64(maxPrefillTokensPerS), n.Value)
	}
	*r = PrefillRate{PerS: v}
	return nil
}

// Toggle is a YAML on|off (also true|false) value; Set says it was given.
type Toggle struct{ On, Set bool }

// UnmarshalYAML implements yaml.Unmarshaler.
func (t *Toggle) UnmarshalYAML(n *yaml.Node) error {
	switch strings.ToLower(n.Value) {
	case "on", "true", "yes":
		*t = Toggle{On: true, Set: true}
	case "off", "false", "no":
		*t = Toggle{On: false, Set: true}
	default:
		return strictyaml.Bad(n, "want on or off, got %q", n.Value)
	}
	return nil
}

// Spill is a spill threshold: "auto" (Auto, a quarter of max_num_seqs),
// a number of in-flight requests, or "priced" (Priced, with Auto: a later
// turn leaves home when its expected time to first token there exceeds the
// one elsewhere; auto's number still bounds a subagent on its parent's
// home).
type Spill struct {
	N      int
	Auto   bool
	Priced bool
}

// UnmarshalYAML implements yaml.Unmarshaler.
// The rule is placement's (ParseSpillThreshold), shared with the planner
// and the simulator.
func (s *Spill) UnmarshalYAML(n *yaml.Node) error {
	t, err := placement.ParseSpillThreshold(n.Value)
	if err != nil {
		return strictyaml.Bad(n, "%v", err)
	}
	switch {
	case t.Priced():
		// It divides by each replica's prefill rate: validate requires
		// prefill_tokens_per_s with it.
		*s = Spill{Auto: true, Priced: true}
	case t.Auto():
		*s = Spill{Auto: true}
	default:
		*s = Spill{N: t.Resolve(0)}
	}
	return nil
}

// Duration is the duration of the proxy's configuration: strictyaml's,
// and never negative (NonNegative: refused where it is read).
type Duration = strictyaml.Duration[strictyaml.NonNegative]

// ByteSize is a size in bytes written as a plain integer or with a suffix
// KiB, MiB, GiB (also KB, MB, GB as powers of 1000).
type ByteSize int64

var sizeRE = regexp.MustCompile(`^([0-9]+)\s*(|B|KB|MB|GB|KiB|MiB|GiB)$`)

// UnmarshalYAML implements yaml.Unmarshaler.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	m := sizeRE.FindStringSubmatch(strings.TrimSpace(n.Value))
	if m == nil {
		return strictyaml.Bad(n, "want a size such as 65536, 64KiB or 16MiB, got %q", n.Value)
	}
	v, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return strictyaml.Bad(n, "size %q: %v", n.Value, err)
	}
	mult := map[string]int64{"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m[2]]
	if v > math.MaxInt64/mult {
		return strictyaml.Bad(n, "size %q is too large", n.Value)
	}
	*b = ByteSize(v * mult)
	return nil
}
