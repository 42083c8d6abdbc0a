package bench

import (
	"encoding/json"
	"io"
	"math"
	"sync"

	"github.com/lm-warden/warden/sim"
)

// requestLog writes Config.Requests: one sim.RequestRecord per request, as
// a JSON line, when the request ends. A nil log writes nothing.
type requestLog struct {
	mu  sync.Mutex
	enc *json.Encoder
	err error // the first write error: the run stops at the step's end
}

func newRequestLog(w io.Writer) *requestLog {
	if w == nil {
		return nil
	}
	return &requestLog{enc: json.NewEncoder(w)}
}

// add writes the record of one request of session (the bench's UUID),
// turn, with its outcome; finished says it was answered to its end.
func (l *requestLog) add(r *runner, session string, turn int, o outcome, finished bool) {
	if l == nil {
		return
	}
	nan := sim.Float(math.NaN())
	rec := sim.RequestRecord{
		Session:      session,
		Turn:         turn,
		Sessions:     o.level,
		Strategy:     r.cfg.Label,
		Replica:      -1, // a client does not see which replica served it
		ArrivalS:     nan,
		TTFBS:        nan,
		FinishS:      nan,
		PromptTokens: max(o.PromptTokens, 0),
		CachedTokens: max(o.CachedTokens, 0),
		OutputTokens: o.Tokens,
		Finished:     finished,
	}
	if rec.Sessions == 0 {
		rec.Sessions = r.openSessions()
	}
	if !finished {
		rec.OutputTokens = o.Deltas
	}
	if !o.sent.IsZero() {
		at := o.sent.Sub(r.began).Seconds() * r.cfg.Speed
		rec.ArrivalS = sim.Float(at)
		if o.TTFB >= 0 {
			rec.TTFBS = sim.Float(o.TTFB.Seconds() * r.cfg.Speed)
		}
		if finished {
			rec.FinishS = sim.Float(at + o.elapsed.Seconds()*r.cfg.Speed)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.err = l.enc.Encode(&rec)
	}
}

// failed is the first write error, nil when none (or no log).
func (l *requestLog) failed() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// openSessions is the open step's sessions.
func (r *runner) openSessions() int {
	a := r.cur.Load()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sessions
}
