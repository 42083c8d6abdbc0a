package traces

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Workload is the shape of synthetic agent sessions (notes/domain.md): a
// shared system prompt, a first user message of each session's own, then
// turns that each add the previous answer and some new user text.
//
// Every figure is a parameter; DefaultWorkload holds the product's shape.
// In YAML (LoadWorkload) the keys are the yaml tags below; durations are
// strings such as "2s".
type Workload struct {
	// SystemPromptTokens is the system prompt shared by every session.
	SystemPromptTokens int `yaml:"system_prompt_tokens"`
	// FirstMessageTokens is the nominal size of each session's first user
	// message (its own content, after templating).
	FirstMessageTokens int `yaml:"first_message_tokens"`
	// FirstMessageSpread is the relative half-width of the first message's
	// size: it is drawn uniformly from FirstMessageTokens*(1±spread).
	FirstMessageSpread float64 `yaml:"first_message_spread"`
	// Turns is the number of requests of a session.
	Turns int `yaml:"turns"`
	// NewTokensPerTurn is the new user text of each turn after the first.
	NewTokensPerTurn int `yaml:"new_tokens_per_turn"`
	// MaxOutputTokens caps every answer (the request's max_tokens).
	MaxOutputTokens int `yaml:"max_output_tokens"`
	// OutputTokensMean and OutputTokensSigma shape the answer length: a
	// lognormal with this mean (before clipping) and this sigma of the
	// underlying normal, rounded and clipped to [1, MaxOutputTokens].
	// A mean of 0 means 0.6*MaxOutputTokens; sigma 0 makes answers constant.
	OutputTokensMean  float64 `yaml:"output_tokens_mean"`
	OutputTokensSigma float64 `yaml:"output_tokens_sigma"`
	// ThinkTime is the client's pause between an answer and the next turn.
	ThinkTime time.Duration `yaml:"think_time"`
	// SubagentProbability is the chance, after each turn but the last of a
	// top-level session, that it spawns a subagent session: the shared
	// system prompt, a task message of SubagentTaskTokens of its own, then
	// SubagentTurns turns shaped like the parent's.
	SubagentProbability float64 `yaml:"subagent_probability"`
	SubagentTurns       int     `yaml:"subagent_turns"`
	SubagentTaskTokens  int     `yaml:"subagent_task_tokens"`
	// Model is written into every request ("" = whatever the farm serves).
	Model string `yaml:"model"`
}

// DefaultWorkload returns the product's workload: about 3.5k shared tokens,
// a 7.3k first message, six turns adding 400 tokens each, answers of at most
// 256 tokens (mean about 150), no think time, no subagents.
func DefaultWorkload() Workload {
	return Workload{
		SystemPromptTokens: 3500,
		FirstMessageTokens: 7300,
		FirstMessageSpread: 0.05,
		Turns:              6,
		NewTokensPerTurn:   400,
		MaxOutputTokens:    256,
		OutputTokensMean:   0.6 * 256,
		OutputTokensSigma:  0.5,
		SubagentTurns:      3,
		SubagentTaskTokens: 2000,
	}
}

// FieldError is a workload value that is out of range. Key is the YAML key.
type FieldError struct {
	Key    string
	Reason string
}

func (e *FieldError) Error() string { return e.Key + ": " + e.Reason }

// Validate checks every figure and returns the first bad one as a
// *FieldError naming its YAML key.
func (w Workload) Validate() error {
	bad := func(key, format string, args ...any) error {
		return &FieldError{Key: key, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case w.SystemPromptTokens < 0:
		return bad("system_prompt_tokens", "must be >= 0, got %d", w.SystemPromptTokens)
	case w.FirstMessageTokens < 1:
		return bad("first_message_tokens", "must be >= 1, got %d", w.FirstMessageTokens)
	case !(w.FirstMessageSpread >= 0 && w.FirstMessageSpread < 1):
		return bad("first_message_spread", "must be in [0, 1), got %g", w.FirstMessageSpread)
	case w.Turns < 1:
		return bad("turns", "must be >= 1, got %d", w.Turns)
	case w.NewTokensPerTurn < 0:
		return bad("new_tokens_per_turn", "must be >= 0, got %d", w.NewTokensPerTurn)
	case w.MaxOutputTokens < 1:
		return bad("max_output_tokens", "must be >= 1, got %d", w.MaxOutputTokens)
	case !(w.OutputTokensMean >= 0) || math.IsInf(w.OutputTokensMean, 0):
		return bad("output_tokens_mean", "must be a finite number >= 0 (0 = 0.6 x max_output_tokens), got %g", w.OutputTokensMean)
	case !(w.OutputTokensSigma >= 0 && w.OutputTokensSigma <= 4):
		return bad("output_tokens_sigma", "must be in [0, 4], got %g", w.OutputTokensSigma)
	case w.ThinkTime < 0:
		return bad("think_time", "must be >= 0s, got %s", w.ThinkTime)
	case !(w.SubagentProbability >= 0 && w.SubagentProbability <= 1):
		return bad("subagent_probability", "must be in [0, 1], got %g", w.SubagentProbability)
	case w.SubagentProbability > 0 && w.SubagentTurns < 1:
		return bad("subagent_turns", "must be >= 1 when subagent_probability > 0, got %d", w.SubagentTurns)
	case w.SubagentProbability > 0 && w.SubagentTaskTokens < 1:
		return bad("subagent_task_tokens", "must be >= 1 when subagent_probability > 0, got %d", w.SubagentTaskTokens)
	}
	return nil
}

// outputMean is the lognormal's mean, OutputTokensMean or its default.
func (w Workload) outputMean() float64 {
	if w.OutputTokensMean > 0 {
		return w.OutputTokensMean
	}
	return 0.6 * float64(w.MaxOutputTokens)
}

// LoadWorkload reads a workload from a strict YAML file: keys left out keep
// DefaultWorkload's values; unknown keys, values of the wrong type and values
// out of range are errors of the form "file:line: key: reason".
func LoadWorkload(path string) (Workload, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Workload{}, err
	}
	return ParseWorkload(data, path)
}

// ParseWorkload is LoadWorkload on bytes; name is used in errors.
func ParseWorkload(data []byte, name string) (Workload, error) {
	w := DefaultWorkload()
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return Workload{}, fmt.Errorf("%s: %s", name, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	lines := keyLines(&root)
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&w); err != nil && !errors.Is(err, io.EOF) {
		return Workload{}, yamlError(name, err, lines)
	}
	if err := w.Validate(); err != nil {
		var fe *FieldError
		if errors.As(err, &fe) {
			if l, ok := lineOf(lines, fe.Key); ok {
				return Workload{}, fmt.Errorf("%s:%d: %w", name, l, err)
			}
			return Workload{}, fmt.Errorf("%s: %w (default value)", name, err)
		}
		return Workload{}, fmt.Errorf("%s: %w", name, err)
	}
	return w, nil
}

// keyLines maps each top-level key of a YAML mapping to its line.
func keyLines(root *yaml.Node) map[int]string {
	lines := map[int]string{}
	n := root
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	if n.Kind != yaml.MappingNode {
		return lines
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		lines[n.Content[i].Line] = n.Content[i].Value
	}
	return lines
}

func lineOf(lines map[int]string, key string) (int, bool) {
	best := 0
	for l, k := range lines {
		if k == key && (best == 0 || l < best) {
			best = l
		}
	}
	return best, best > 0
}

var (
	reYAMLLine    = regexp.MustCompile(`^line (\d+): (.*)$`)
	reYAMLUnknown = regexp.MustCompile(`^field (\S+) not found in type \S+$`)
)

// yamlError rewrites yaml.v3's errors as "file:line: key: reason".
func yamlError(name string, err error, lines map[int]string) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return fmt.Errorf("%s: %s", name, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	msgs := make([]string, 0, len(te.Errors))
	for _, e := range te.Errors {
		m := reYAMLLine.FindStringSubmatch(e)
		if m == nil {
			msgs = append(msgs, name+": "+e)
			continue
		}
		line, _ := strconv.Atoi(m[1])
		reason := m[2]
		key := lines[line]
		if u := reYAMLUnknown.FindStringSubmatch(reason); u != nil {
			key, reason = u[1], "unknown key"
		}
		if key == "" {
			msgs = append(msgs, fmt.Sprintf("%s:%d: %s", name, line, reason))
			continue
		}
		msgs = append(msgs, fmt.Sprintf("%s:%d: %s: %s", name, line, key, reason))
	}
	return errors.New(strings.Join(msgs, "; "))
}
