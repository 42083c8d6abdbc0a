package strictyaml

import (
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a time.Duration written as Go writes one: "30m", "1s",
// "100us", in YAML and, through MarshalText and UnmarshalText, in JSON. It
// is the one duration of every file warden reads. The files differ in one
// rule, which R names, with the wording each file's errors have always
// had:
//
//   - [AnySign]: a negative duration is read as written, and the section
//     that holds it refuses it by key where it must (a farm spec, a plan:
//     "routing.session_ttl: must be > 0").
//   - [NonNegative]: no duration of the file may be negative, and one is
//     refused where it is read (the proxy's configuration).
//
// A package names its instance once (sim.Duration, live.Duration).
type Duration[R DurationRule] time.Duration

// DurationRule is what a [Duration] accepts: [AnySign] or [NonNegative].
type DurationRule interface {
	// refuse says why the node n, read as d (err: it did not parse), is
	// not a duration of the file; "" takes it.
	refuse(n *yaml.Node, d time.Duration, err error) string
}

// AnySign reads any duration, negative ones included.
type AnySign struct{}

func (AnySign) refuse(n *yaml.Node, _ time.Duration, err error) string {
	switch {
	case n.Kind != yaml.ScalarNode:
		return "want a duration such as 1s or 30m"
	case err != nil:
		return fmt.Sprintf("%q is not a duration (want e.g. 1s, 30m, 100us)", n.Value)
	}
	return ""
}

// NonNegative reads durations of 0 and more.
type NonNegative struct{}

func (NonNegative) refuse(n *yaml.Node, d time.Duration, err error) string {
	if err != nil || d < 0 {
		return fmt.Sprintf("want a duration such as 1s or 30m, got %q", n.Value)
	}
	return ""
}

// UnmarshalYAML reads a Go duration string under R's rule.
func (d *Duration[R]) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	var rule R
	if why := rule.refuse(n, v, err); why != "" {
		return Bad(n, "%s", why)
	}
	*d = Duration[R](v)
	return nil
}

// D returns the value as a time.Duration.
func (d Duration[R]) D() time.Duration { return time.Duration(d) }

// MarshalText writes the duration as time.Duration.String does.
func (d Duration[R]) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText reads what MarshalText writes (JSON round trips).
func (d *Duration[R]) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%q is not a duration (want e.g. 1s, 30m, 100us)", b)
	}
	*d = Duration[R](v)
	return nil
}
