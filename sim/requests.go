package sim

import (
	"bytes"
	"encoding/json"
	"math"

	"github.com/lm-warden/warden/placement"
)

// RequestRecord is one request of a run, as `warden sim --requests FILE`
// writes it: one JSON object per line, in the order requests left the
// simulation (finished, cut at the end, or rejected), strategy after
// strategy. Times are seconds of simulated time since the strategy's run
// began, client side.
type RequestRecord struct {
	Session  string `json:"session"`
	Turn     int    `json:"turn"`
	Sessions int    `json:"sessions"` // the level of the step its TTFB counts in
	Strategy string `json:"strategy"`
	Replica  int    `json:"replica"` // -1: rejected before routing
	// ArrivalS is when the client sent it; TTFBS the time to its first
	// token as the step's TTFB columns count it (for a censored request,
	// the wait it had when its step closed), null when it had none;
	// FinishS when the client read its end, null when unfinished.
	ArrivalS     Float  `json:"arrival_s"`
	TTFBS        Float  `json:"ttfb_s"`
	FinishS      Float  `json:"finish_s"`
	PromptTokens int    `json:"prompt_tokens"`
	CachedTokens int    `json:"cached_tokens"`
	OutputTokens int    `json:"output_tokens"` // generated
	Finished     bool   `json:"finished"`
	Censored     bool   `json:"censored"` // still waiting for its first token when its step closed
	Reason       string `json:"reason"`   // the placement reason ("" when rejected)
	// APIServer is the vLLM API server its connection reached, behind
	// vLLM's own data-parallel front end (least-loaded); absent otherwise.
	APIServer *int `json:"api_server,omitempty"`
	// Attempt numbers a client's retries of a request refused for
	// admission (a session replay's clients retry as their SDKs do): 0,
	// omitted, for the first. A retry's ArrivalS is its first attempt's,
	// when the client's call began; its TTFB counts from there.
	Attempt int `json:"attempt,omitempty"`
}

// requestLog buffers one strategy's records as JSON lines.
type requestLog struct {
	strategy string
	buf      bytes.Buffer
	enc      *json.Encoder
}

func newRequestLog(strategy string) *requestLog {
	l := &requestLog{strategy: strategy}
	l.enc = json.NewEncoder(&l.buf)
	return l
}

// add writes the record of s, which left the simulation at now.
func (l *requestLog) add(r *run, s *seq, finished bool) {
	nan := Float(math.NaN())
	rec := RequestRecord{
		Session:      s.req.Session,
		Turn:         s.turn,
		Sessions:     s.stepSessions,
		Strategy:     l.strategy,
		Replica:      s.replica,
		ArrivalS:     Float(float64(s.clientSentUs) / usPerSec),
		TTFBS:        nan,
		FinishS:      nan,
		PromptTokens: s.prompt,
		CachedTokens: s.cachedTokens,
		OutputTokens: s.generated,
		Finished:     finished,
		Censored:     s.censored,
		Attempt:      int(s.attempt),
	}
	if r.front != nil && s.apiServer >= 0 {
		k := int(s.apiServer)
		rec.APIServer = &k
	}
	if s.rejected || s.replica < 0 {
		rec.Replica = -1
	} else {
		rec.Reason = placement.Reason(s.reason).String()
	}
	if s.ttfbUs >= 0 {
		rec.TTFBS = Float(float64(s.ttfbUs) / usPerSec)
	}
	if finished {
		rec.FinishS = Float(float64(r.now+r.downlinkUs) / usPerSec)
	}
	_ = l.enc.Encode(&rec) // a bytes.Buffer does not fail
}
