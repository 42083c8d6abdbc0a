package traces

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

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

	// The keys below (issue 48) shape agent sessions as they are; each is
	// off when left out, so a file without them means what it always did.
	// WORKLOAD.md lists every key with its unit and default.

	// TurnsSigma > 0 draws each session's number of turns from a lognormal
	// of mean Turns and this sigma (sessions of tens to hundreds of
	// requests, a few far longer), rounded, at least 1 and at most
	// TurnsMax (0: no bound).
	TurnsSigma float64 `yaml:"turns_sigma,omitempty" json:",omitzero"`
	TurnsMax   int     `yaml:"turns_max,omitempty" json:",omitzero"`
	// Additions, when given, replace NewTokensPerTurn and ThinkTime: each
	// later turn adds one of these, drawn by weight (a mixture of tool
	// results and a person's messages, each with its size and the pause
	// before it).
	Additions []Addition `yaml:"additions,omitempty" json:",omitzero"`
	// ContextLimit > 0 (tokens) makes sessions compact as agents do near
	// their model's context window: when a turn's prompt would pass
	// CompactAt x ContextLimit, the agent first sends its history with
	// CompactPromptTokens of instructions and gets a summary of
	// SummaryTokens back; the next prompt is the system prompt, the
	// summary and the turn's addition. The old prefix is dead and the new
	// one cold.
	ContextLimit        int       `yaml:"context_limit,omitempty" json:",omitzero"`
	CompactAt           float64   `yaml:"compact_at,omitempty" json:",omitzero"` // 0: DefaultCompactAt
	SummaryTokens       TokenDist `yaml:"summary_tokens,omitempty" json:",omitzero"`
	CompactPromptTokens int       `yaml:"compact_prompt_tokens,omitempty" json:",omitzero"`
	// SubagentParallel is how many subagents a spawn starts at once (0:
	// one); they run side by side while the parent waits, and the parent's
	// next turn adds their final answers. SubagentTurnsSigma spreads their
	// turns as TurnsSigma does the parent's. SubagentSystemPromptTokens > 0
	// gives subagents a system prompt of their own, shared by every
	// subagent of the agent kind (0: the parent's). SubagentSession is the
	// session id their requests carry: SubagentOwn, SubagentParent or
	// SubagentNone.
	SubagentParallel           TokenDist `yaml:"subagent_parallel,omitempty" json:",omitzero"`
	SubagentTurnsSigma         float64   `yaml:"subagent_turns_sigma,omitempty" json:",omitzero"`
	SubagentSystemPromptTokens int       `yaml:"subagent_system_prompt_tokens,omitempty" json:",omitzero"`
	SubagentSession            string    `yaml:"subagent_session,omitempty" json:",omitzero"`
	// Agents, when given, are several agent kinds sharing the farm: each
	// new session is of one kind, drawn by weight, with that kind's own
	// system prompt and shape.
	Agents []Agent `yaml:"agents,omitempty" json:",omitzero"`
}

// Addition is one kind of new content a later turn adds: a tool's result
// (Kind AdditionTool, after the tool ran for Think) or a person's message
// (AdditionUser, after they read and typed for Think).
type Addition struct {
	Kind   string    `yaml:"kind" json:"kind"`
	Weight float64   `yaml:"weight" json:"weight"`
	Tokens TokenDist `yaml:"tokens" json:"tokens"`
	Think  TimeDist  `yaml:"think,omitempty" json:"think,omitzero"`
}

// Kinds of an Addition.
const (
	AdditionTool = "tool"
	AdditionUser = "user"
)

// Session ids of subagents (Workload.SubagentSession).
const (
	// SubagentOwn: a session id of their own with the parent's as parent,
	// as OpenCode sends (X-Session-Id and X-Parent-Session-Id) and Claude
	// Code since 2.1.258 (x-claude-code-agent-id beside the parent's
	// X-Claude-Code-Session-Id, which the proxy keys as a session of its
	// own under the parent). The default.
	SubagentOwn = "own"
	// SubagentParent: the parent's session id, as Codex sends (its
	// session-id is the run's, shared by the threads it spawns) and Claude
	// Code before agent ids: a router sees later turns of the parent.
	SubagentParent = "parent"
	// SubagentNone: no session id; a router sees new conversations.
	SubagentNone = "none"
)

// DefaultCompactAt is the compaction trigger when CompactAt is 0: Codex's
// default, 90 % of the context window (codex-rs/protocol/src/
// openai_models.rs, ModelInfo.auto_compact_token_limit).
const DefaultCompactAt = 0.9

// Agent is one agent kind of a workload's Agents: Weight is its share of
// new sessions; its shape is the preset or file Workload names (else the
// enclosing workload's keys), with the keys given beside it on top. Name
// tells the kinds apart: two kinds never share a system prompt.
type Agent struct {
	Name     string  `yaml:"name,omitempty" json:"name,omitempty"`
	Weight   float64 `yaml:"weight" json:"weight"`
	Workload string  `yaml:"workload,omitempty" json:"workload,omitempty"`
	// Shape is the kind's workload, resolved (ParseWorkload fills it).
	Shape Workload `yaml:",inline" json:"shape"`
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
	return w.validateShape(true)
}

// validateShape checks the keys of issue 48; top says whether w may hold
// agent kinds (a kind's own workload may not).
func (w Workload) validateShape(top bool) error {
	bad := func(key, format string, args ...any) error {
		return &FieldError{Key: key, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case w.Turns > MaxTurns:
		return bad("turns", "must be at most %d, got %d", MaxTurns, w.Turns)
	case w.SystemPromptTokens > MaxTokens || w.FirstMessageTokens > MaxTokens || w.NewTokensPerTurn > MaxTokens || w.SubagentTaskTokens > MaxTokens:
		key := "system_prompt_tokens"
		switch {
		case w.FirstMessageTokens > MaxTokens:
			key = "first_message_tokens"
		case w.NewTokensPerTurn > MaxTokens:
			key = "new_tokens_per_turn"
		case w.SubagentTaskTokens > MaxTokens:
			key = "subagent_task_tokens"
		}
		return bad(key, "must be at most %d tokens", MaxTokens)
	case w.SubagentTurns > MaxTurns:
		return bad("subagent_turns", "must be at most %d, got %d", MaxTurns, w.SubagentTurns)
	case !(w.TurnsSigma >= 0 && w.TurnsSigma <= 4):
		return bad("turns_sigma", "must be in [0, 4], got %g", w.TurnsSigma)
	case w.TurnsMax < 0 || w.TurnsMax > MaxTurns:
		return bad("turns_max", "must be in [0, %d] (0: no bound), got %d", MaxTurns, w.TurnsMax)
	case w.TurnsSigma > 0 && w.TurnsMax == 0:
		return bad("turns_max", "required with turns_sigma: a heavy tail of turns needs a bound")
	case w.ContextLimit < 0 || w.ContextLimit > MaxTokens:
		return bad("context_limit", "must be in [0, %d] tokens (0: no compaction), got %d", MaxTokens, w.ContextLimit)
	case w.SubagentSystemPromptTokens > MaxTokens || w.CompactPromptTokens > MaxTokens:
		key := "subagent_system_prompt_tokens"
		if w.CompactPromptTokens > MaxTokens {
			key = "compact_prompt_tokens"
		}
		return bad(key, "must be at most %d tokens", MaxTokens)
	case !(w.CompactAt >= 0 && w.CompactAt <= 1):
		return bad("compact_at", "must be a fraction of context_limit in (0, 1] (0: %g), got %g", DefaultCompactAt, w.CompactAt)
	case w.CompactPromptTokens < 0:
		return bad("compact_prompt_tokens", "must be >= 0, got %d", w.CompactPromptTokens)
	case !(w.SubagentTurnsSigma >= 0 && w.SubagentTurnsSigma <= 4):
		return bad("subagent_turns_sigma", "must be in [0, 4], got %g", w.SubagentTurnsSigma)
	case w.SubagentSystemPromptTokens < 0:
		return bad("subagent_system_prompt_tokens", "must be >= 0 (0: the parent's system prompt), got %d", w.SubagentSystemPromptTokens)
	case w.SubagentSession != "" && w.SubagentSession != SubagentOwn && w.SubagentSession != SubagentParent && w.SubagentSession != SubagentNone:
		return bad("subagent_session", "must be %s, %s or %s, got %q", SubagentOwn, SubagentParent, SubagentNone, w.SubagentSession)
	}
	if w.ContextLimit > 0 {
		if w.SummaryTokens.IsZero() {
			return bad("context_limit", "needs summary_tokens: the size of the summary a compaction leaves")
		}
		if why := w.SummaryTokens.checkBounded(1, MaxTokens); why != "" {
			return bad("summary_tokens", "%s", why)
		}
		// The smallest context a compaction can leave: the system prompt
		// and the summary's least size.
		floor := w.SystemPromptTokens + int(max(1, w.SummaryTokens.Min))
		at := w.compactAt() * float64(w.ContextLimit)
		if at <= float64(floor) {
			return bad("context_limit", "compact_at x context_limit = %.0f tokens leaves no room beyond the system prompt (%d) and the summary", at, w.SystemPromptTokens)
		}
		if first := float64(w.SystemPromptTokens) + float64(w.FirstMessageTokens)*(1+w.FirstMessageSpread); first > at {
			return bad("context_limit", "compact_at x context_limit = %.0f tokens is below a first prompt (system prompt and first message: up to %.0f)", at, first)
		}
		if sub := w.SubagentSystemPromptTokens + w.SubagentTaskTokens; w.SubagentProbability > 0 && float64(max(sub, w.SystemPromptTokens+w.SubagentTaskTokens)) > at {
			return bad("context_limit", "compact_at x context_limit = %.0f tokens is below a subagent's first prompt", at)
		}
	} else if !w.SummaryTokens.IsZero() || w.CompactAt != 0 || w.CompactPromptTokens != 0 {
		key := "summary_tokens"
		if w.CompactAt != 0 {
			key = "compact_at"
		} else if w.CompactPromptTokens != 0 {
			key = "compact_prompt_tokens"
		}
		return bad(key, "needs context_limit (the context window compaction keeps sessions within)")
	}
	if !w.SubagentParallel.IsZero() {
		if why := w.SubagentParallel.checkBounded(1, MaxSubagents); why != "" {
			return bad("subagent_parallel", "%s", why)
		}
	}
	var sum float64
	for i, a := range w.Additions {
		key := fmt.Sprintf("additions[%d]", i)
		switch {
		case a.Kind != AdditionTool && a.Kind != AdditionUser:
			return bad(key+".kind", "must be %s (a tool's result) or %s (a person's message), got %q", AdditionTool, AdditionUser, a.Kind)
		case !(a.Weight > 0) || math.IsInf(a.Weight, 0):
			return bad(key+".weight", "must be a finite number > 0, got %g", a.Weight)
		case a.Tokens.IsZero():
			return bad(key+".tokens", "required: the tokens this addition brings")
		}
		if why := a.Tokens.checkBounded(0, MaxTokens); why != "" {
			return bad(key+".tokens", "%s", why)
		}
		if why := a.Think.checkBounded(0, 24*3600); why != "" {
			return bad(key+".think", "%s (a pause of more than 24h is a session that ended)", why)
		}
		sum += a.Weight
	}
	if math.IsInf(sum, 0) {
		return bad("additions", "the weights add up to infinity")
	}
	if len(w.Agents) > 0 && !top {
		return bad("agents", "an agent kind's workload cannot hold agent kinds of its own")
	}
	names := map[string]bool{}
	var total float64
	for i, a := range w.Agents {
		key := fmt.Sprintf("agents[%d]", i)
		switch {
		case !(a.Weight > 0) || math.IsInf(a.Weight, 0):
			return bad(key+".weight", "must be a finite number > 0, got %g", a.Weight)
		case names[a.Name]:
			return bad(key+".name", "%q names two agent kinds: give each its own name", a.Name)
		}
		names[a.Name] = true
		total += a.Weight
		if err := a.Shape.Validate(); err != nil {
			var fe *FieldError
			if errors.As(err, &fe) {
				return bad(key+"."+fe.Key, "%s", fe.Reason)
			}
			return bad(key, "%v", err)
		}
		if len(a.Shape.Agents) > 0 {
			return bad(key+".agents", "an agent kind's workload cannot hold agent kinds of its own")
		}
	}
	if math.IsInf(total, 0) {
		return bad("agents", "the weights add up to infinity")
	}
	return nil
}

// Bounds of a workload's figures: beyond them a value is a typo (and a
// generator would hold it in memory).
const (
	MaxTurns     = 100000   // requests of a session
	MaxTokens    = 10000000 // tokens of any one figure
	MaxSubagents = 1000     // subagents spawned at once
)

// compactAt is CompactAt or its default.
func (w Workload) compactAt() float64 {
	if w.CompactAt > 0 {
		return w.CompactAt
	}
	return DefaultCompactAt
}

// IsZero reports a workload left out entirely (every field zero): what an
// Experiment or a plan replaces with DefaultWorkload.
func (w Workload) IsZero() bool { return reflect.ValueOf(w).IsZero() }

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

// ParseWorkload is LoadWorkload on bytes; name is used in errors, and
// the agent kinds' workload files are read relative to its directory.
func ParseWorkload(data []byte, name string) (Workload, error) {
	return parseWorkload(data, name, 0)
}

// parseWorkload parses a workload file at depth (0: the one asked for;
// 1: an agent kind's workload, which may not have kinds of its own).
func parseWorkload(data []byte, name string, depth int) (Workload, error) {
	w := DefaultWorkload()
	doc, err := strictyaml.Decode(name, data, &w)
	if err != nil {
		return Workload{}, err
	}
	if err := w.resolveAgents(doc, name, depth); err != nil {
		return Workload{}, err
	}
	if err := w.Validate(); err != nil {
		var fe *FieldError
		if errors.As(err, &fe) {
			if l, ok := doc.Line(fe.Key); ok {
				return Workload{}, fmt.Errorf("%s:%d: %w", name, l, err)
			}
			if l, ok := doc.Nearest(fe.Key); ok && strings.Contains(fe.Key, "[") {
				return Workload{}, fmt.Errorf("%s:%d: %w", name, l, err)
			}
			return Workload{}, fmt.Errorf("%s: %w (default value)", name, err)
		}
		return Workload{}, fmt.Errorf("%s: %w", name, err)
	}
	return w, nil
}

// clientKeys are the keys of the clients' side, one for the whole farm: an
// agent kind may not set them.
var clientKeys = map[string]bool{"client_turnaround": true, "network_rtt": true, "api_server_time": true,
	"api_server_per_1k_tokens": true, "connections": true, "model": true}

// resolveAgents fills each agent kind's Shape: the preset or file its
// workload key names (else w's own keys), with the keys given in its entry
// on top.
func (w *Workload) resolveAgents(doc *strictyaml.Doc, name string, depth int) error {
	if len(w.Agents) == 0 {
		return nil
	}
	if depth > 0 {
		return doc.Errorf("agents", "an agent kind's workload cannot hold agent kinds of its own")
	}
	base := *w
	base.Agents = nil
	for i := range w.Agents {
		a := &w.Agents[i]
		prefix := fmt.Sprintf("agents[%d].", i)
		var given []string
		for _, p := range doc.Paths() {
			k, ok := strings.CutPrefix(p, prefix)
			if !ok || strings.ContainsAny(k, ".[") {
				continue
			}
			switch {
			case k == "agents":
				return doc.Errorf(p, "an agent kind's workload cannot hold agent kinds of its own")
			case clientKeys[k]:
				return doc.Errorf(p, "the clients' side is the farm's: set %s once, at the top level", k)
			case k != "name" && k != "weight" && k != "workload":
				given = append(given, k)
			}
		}
		shape := base
		if a.Workload != "" {
			var err error
			if shape, err = resolveRef(a.Workload, filepath.Dir(name), depth+1); err != nil {
				return doc.Errorf(prefix+"workload", "%v", err)
			}
			for k := range clientKeys { // the farm's clients, whatever the kind
				copyKey(&shape, base, k)
			}
		}
		for _, k := range given {
			copyKey(&shape, a.Shape, k)
		}
		a.Shape = shape
		if a.Name == "" {
			a.Name = a.Workload
			if a.Name == "" {
				a.Name = fmt.Sprintf("agent%d", i+1)
			}
		}
	}
	return nil
}

// MarshalYAML writes the kind's name, weight and workload and its shape's
// keys, less those of the clients' side (the farm's, set at the top
// level) and agents: what ParseWorkload reads back to the same kind.
func (a Agent) MarshalYAML() (any, error) {
	var shape yaml.Node
	if err := shape.Encode(a.Shape); err != nil {
		return nil, err
	}
	out := &yaml.Node{Kind: yaml.MappingNode}
	add := func(k string, v any) error {
		var n yaml.Node
		if err := n.Encode(v); err != nil {
			return err
		}
		out.Content = append(out.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: k}, &n)
		return nil
	}
	if a.Name != "" {
		if err := add("name", a.Name); err != nil {
			return nil, err
		}
	}
	if err := add("weight", a.Weight); err != nil {
		return nil, err
	}
	if a.Workload != "" {
		if err := add("workload", a.Workload); err != nil {
			return nil, err
		}
	}
	for i := 0; i+1 < len(shape.Content); i += 2 {
		if k := shape.Content[i].Value; !clientKeys[k] && k != "agents" {
			out.Content = append(out.Content, shape.Content[i], shape.Content[i+1])
		}
	}
	return out, nil
}

// yamlFields maps each YAML key of Workload to its field index.
var yamlFields = func() map[string]int {
	m := map[string]int{}
	t := reflect.TypeFor[Workload]()
	for i := range t.NumField() {
		tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if tag != "" && tag != "-" {
			m[tag] = i
		}
	}
	return m
}()

// copyKey sets dst's field of YAML key k to src's.
func copyKey(dst *Workload, src Workload, k string) {
	if i, ok := yamlFields[k]; ok {
		reflect.ValueOf(dst).Elem().Field(i).Set(reflect.ValueOf(src).Field(i))
	}
}
