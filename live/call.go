package live

import (
	"context"
	"github.com/lm-warden/warden/live/upstream"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/traces"
)

// call is one client request on its way through the proxy.
type call struct {
	srv       *Server
	m         *model
	api       API
	path      string
	in        *http.Request  // the client's request, for a retry's outgoing one (set by ServeHTTP)
	rb        *upstream.Body // the request body (rb.Bytes()), given back at finish
	stream    bool
	req       placement.Request // Session/Parent are keyed hashes
	source    string            // where the session id came from
	turnKnown bool              // the session was known before this request (for the journal)
	// countTokens: a count_tokens request, no conversation turn: no
	// session, turn or journal record.
	countTokens bool
	// lastTurn: the client said this is its conversation's last turn
	// (HeaderSessionEnd): the conversation is forgotten when it ends.
	lastTurn bool
	start    time.Time

	cur      *attempt    // the attempt whose response is being served
	reason   string      // reason of cur: a placement reason or "retried"
	attempts int         // attempts made
	noRep    atomic.Bool // a retry found no replica

	ttfb     atomic.Int64 // ns from start to first output token; 0: none
	usage    Usage
	status   int
	finished atomic.Bool
	jt       journalTicket // place in the journal's arrival order
}

// place picks the replica of c's attempt (exclude: the replica a failed
// first attempt went to, or -1): a conversation turn through the policy, a
// count_tokens request apart from it (model.pickCountTokens).
func (c *call) place(ctx context.Context, exclude int, now time.Time) (picked, error) {
	if c.countTokens {
		return c.m.pickCountTokens(exclude, now)
	}
	if exclude < 0 {
		return c.m.place(ctx, &c.req, now) // the first attempt: through the session store, if any
	}
	return c.m.pick(&c.req, exclude, now)
}

// fillPrompt describes c's prompt by its canonical-text blocks
// (traces.TextBlockIDs with the emulator's key: kvHeld says why) when its
// model's policy reads what each replica holds of it; once, before the
// first attempt. A count_tokens request is no turn and gets none.
func (c *call) fillPrompt() {
	if c.countTokens || !c.m.readsHeld || c.req.Prompt.Blocks != nil {
		return
	}
	text := promptText(c.rb.Bytes(), c.api)
	c.req.Prompt = placement.Prompt{
		BlockTokens: traces.TextBlockTokens,
		Blocks:      traces.TextBlockIDs([]byte(traces.EmulatorBlockKey), text, traces.TextTokens(text)),
	}
}

// finish records a call once its response is over (or failed), and gives
// back its count of limits.max_in_flight (taken by admit), last.
func (c *call) finish() {
	if !c.finished.CompareAndSwap(false, true) {
		return
	}
	defer c.srv.inFlight.Add(-1)
	defer c.rb.Release() // after the journal's record, the body's last reader here
	c.cur.release()
	s, name := c.srv, c.m.cfg.Name
	now := time.Now()
	switch {
	case c.countTokens:
		c.m.observe("", 0, now) // no turn, but the request left: wake a waiter
	case c.status < 400:
		// The conversation's footprint: prompt + answer from the usage,
		// else the prompt estimated from the body size.
		fp := c.req.PromptTokens
		if c.usage.PromptTokens > 0 {
			fp = c.usage.PromptTokens
		}
		c.m.observeHits(c.req.Session, c.cur.rep, c.usage)
		c.m.observe(c.req.Session, fp+max(c.usage.OutputTokens, 0), now)
	default:
		c.m.observe(c.req.Session, 0, now) // the turn ended, with no footprint to record
	}
	if c.lastTurn && !c.countTokens && c.req.Session != "" {
		c.m.endSession(c.req.Session)
	}
	dur := now.Sub(c.start)
	if c.countTokens { // no turn: only its own counter
		s.obs.countTokens.WithLabelValues(name).Inc()
		s.log.Debug("count_tokens", "model", name, "replica", c.cur.rep.id, "status", c.status, "attempts", c.attempts, "duration", dur)
		return
	}
	s.obs.requests.WithLabelValues(name, strconv.Itoa(c.cur.rep.id), c.reason).Inc()
	c.cur.rep.byReason[reasonIndex(c.reason)].Add(1)
	s.obs.duration.WithLabelValues(name).Observe(dur.Seconds())
	if c.usage.OutputTokens > 0 {
		s.obs.outputTokens.WithLabelValues(name).Add(float64(c.usage.OutputTokens))
	}
	if c.usage.PromptTokens > 0 {
		s.obs.promptTokens.WithLabelValues(name).Add(float64(c.usage.PromptTokens))
	}
	if s.journal != nil {
		s.journal.record(c, dur)
	}
	s.log.Debug("request", "model", name, "replica", c.cur.rep.id, "reason", c.reason,
		"session", shortID(c.req.Session), "source", c.source, "status", c.status,
		"attempts", c.attempts, "duration", dur)
}

func reasonIndex(reason string) int {
	if reason == "retried" {
		return reasonRetried
	}
	r, err := placement.ParseReason(reason)
	if err != nil {
		return reasonRetried
	}
	return int(r)
}

// shortID abbreviates a keyed session hash for logs.
func shortID(h string) string { return h[:min(len(h), 12)] }
