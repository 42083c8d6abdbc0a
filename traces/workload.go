package traces

import (
	"errors"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/lm-warden/warden/internal/strictyaml"
)

// Workload is the shape of synthetic agent sessions (the product's
// published benchmark, sim/testdata/validation/README.md): a
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
	// OutputTokens is how long answers are: OutputMax ("max", the default:
	// every answer runs to MaxOutputTokens and finishes with reason
	// "length", as the product's bench saw almost always) or
	// OutputLognormal ("lognormal", shaped by the two fields below).
	OutputTokens string `yaml:"output_tokens"`
	// OutputTokensMean and OutputTokensSigma shape a lognormal answer
	// length: this mean (before clipping) and this sigma of the underlying
	// normal, rounded and clipped to [1, MaxOutputTokens]. A mean of 0
	// means 0.6*MaxOutputTokens; sigma 0 makes answers constant.
	OutputTokensMean  float64 `yaml:"output_tokens_mean"`
	OutputTokensSigma float64 `yaml:"output_tokens_sigma"`
	// ThinkTime is the user's pause between an answer and the next turn.
	ThinkTime time.Duration `yaml:"think_time"`
	// ClientTurnaround is the client's own time between receiving the end
	// of an answer and sending the next turn: parsing the stream, building
	// the next request. A local Go bench client takes about a millisecond.
	ClientTurnaround time.Duration `yaml:"client_turnaround"`
	// NetworkRTT is the round trip between client and server: half of it
	// before the request reaches the server, half before each streamed
	// event (the first token, the end) reaches the client. Loopback or a
	// LAN: well under a millisecond; over the Internet tens of ms.
	NetworkRTT time.Duration `yaml:"network_rtt"`
	// APIServerTime is the OpenAI server's work on a request before its
	// engine sees it (chat templating, tokenising the whole prompt): a
	// fixed part plus APIServerPerKToken for every 1,000 prompt tokens. A
	// server does it for one request at a time (APIWork).
	APIServerTime      time.Duration `yaml:"api_server_time"`
	APIServerPerKToken time.Duration `yaml:"api_server_per_1k_tokens"`
	// Connections is how the client's requests map onto connections, which
	// decides the vLLM API server each reaches when several share the port:
	// ConnectionsPool ("pool", the default: a pool of keep-alive
	// connections as Go's http.Transport keeps, the most recently returned
	// idle one reused, a new one dialled when none is idle),
	// ConnectionsSession (one connection per session) or
	// ConnectionsRequest (a new connection per request).
	Connections string `yaml:"connections"`
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
		OutputTokens:       OutputMax,
		OutputTokensMean:   0.6 * 256,
		OutputTokensSigma:  0.5,
		SubagentTurns:      3,
		SubagentTaskTokens: 2000,
		// What a bench client on the same machine or LAN as the server
		// sees: a loopback round trip, a millisecond of client work, and
		// vLLM's API server templating and tokenising the prompt (fast
		// tokenizers encode on the order of a million tokens per second
		// per core, so ~10 ms for the product's 12k-token prompts with
		// the templating).
		ClientTurnaround:   time.Millisecond,
		NetworkRTT:         200 * time.Microsecond,
		APIServerTime:      2 * time.Millisecond,
		APIServerPerKToken: 700 * time.Microsecond,
		Connections:        ConnectionsPool,
	}
}

// Client connection models of Workload.Connections.
const (
	ConnectionsPool    = "pool"
	ConnectionsSession = "session"
	ConnectionsRequest = "request"
)

// Answer-length models of Workload.OutputTokens.
const (
	OutputMax       = "max"
	OutputLognormal = "lognormal"
)

// APIWork is vLLM's API server's work on a request of prompt tokens
// before its engine sees it: templating and tokenising. A server works on
// one request at a time, so concurrent requests queue for it (package
// sim's apiserver.go).
func (w Workload) APIWork(prompt int) time.Duration {
	return w.APIServerTime + time.Duration(float64(w.APIServerPerKToken)*float64(prompt)/1000)
}

// Downlink is the time from the engine emitting an event to the client
// reading it: half the round trip.
func (w Workload) Downlink() time.Duration { return w.NetworkRTT / 2 }

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
	case w.Connections != "" && w.Connections != ConnectionsPool && w.Connections != ConnectionsSession && w.Connections != ConnectionsRequest:
		return bad("connections", "must be %s, %s or %s, got %q", ConnectionsPool, ConnectionsSession, ConnectionsRequest, w.Connections)
	case w.OutputTokens != "" && w.OutputTokens != OutputMax && w.OutputTokens != OutputLognormal:
		return bad("output_tokens", "must be %s or %s, got %q", OutputMax, OutputLognormal, w.OutputTokens)
	case !(w.OutputTokensMean >= 0) || math.IsInf(w.OutputTokensMean, 0):
		return bad("output_tokens_mean", "must be a finite number >= 0 (0 = 0.6 x max_output_tokens), got %g", w.OutputTokensMean)
	case !(w.OutputTokensSigma >= 0 && w.OutputTokensSigma <= 4):
		return bad("output_tokens_sigma", "must be in [0, 4], got %g", w.OutputTokensSigma)
	case w.ThinkTime < 0:
		return bad("think_time", "must be >= 0s, got %s", w.ThinkTime)
	case w.ClientTurnaround < 0 || w.ClientTurnaround > time.Hour:
		return bad("client_turnaround", "must be in [0s, 1h], got %s", w.ClientTurnaround)
	case w.NetworkRTT < 0 || w.NetworkRTT > time.Minute:
		return bad("network_rtt", "must be in [0s, 1m], got %s", w.NetworkRTT)
	case w.APIServerTime < 0 || w.APIServerTime > time.Minute:
		return bad("api_server_time", "must be in [0s, 1m], got %s", w.APIServerTime)
	case w.APIServerPerKToken < 0 || w.APIServerPerKToken > time.Second:
		return bad("api_server_per_1k_tokens", "must be in [0s, 1s], got %s", w.APIServerPerKToken)
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
	doc, err := strictyaml.Decode(name, data, &w)
	if err != nil {
		return Workload{}, err
	}
	if err := w.Validate(); err != nil {
		var fe *FieldError
		if errors.As(err, &fe) {
			if l, ok := doc.Line(fe.Key); ok {
				return Workload{}, fmt.Errorf("%s:%d: %w", name, l, err)
			}
			return Workload{}, fmt.Errorf("%s: %w (default value)", name, err)
		}
		return Workload{}, fmt.Errorf("%s: %w", name, err)
	}
	return w, nil
}
