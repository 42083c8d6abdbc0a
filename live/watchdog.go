package live

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// Phases of a watchdog: the timeout it counts.
const (
	phaseHeaders    int32 = iota + 1 // sent -> reply headers (timeouts.response_header)
	phaseFirstToken                  // a stream: sent -> first output (timeouts.first_token)
	phaseIdle                        // an event stream: the wait for its next event (timeouts.stream_idle)
	phaseBody                        // any other reply: the time spent waiting for it (timeouts.stream_idle)
)

// watchdog bounds one phase of an attempt at a time; on expiry it cancels
// the attempt's context. Every attempt has one from the moment it is sent
// to the end of its reply (issue 35: a reply's body was untimed unless it
// was an event stream answering a streamed request). A nil watchdog never
// fires. Its methods other than the timer's own function are called on the
// request's goroutine.
type watchdog struct {
	t     *time.Timer
	fired atomic.Int32 // the phase it expired in; 0: it did not
	phase atomic.Int32
	limit time.Duration // the current phase's
	left  time.Duration // phaseBody: what is left of the wait allowed
	since time.Time     // phaseBody: when the current wait began; zero: none
}

func startWatchdog(phase int32, d time.Duration, cancel context.CancelFunc) *watchdog {
	w := &watchdog{limit: d}
	w.phase.Store(phase)
	w.t = time.AfterFunc(d, func() { w.fired.CompareAndSwap(0, w.phase.Load()); cancel() })
	return w
}

// enter switches to phase with the limit d: for phaseBody the timer runs
// only while a read waits (waiting, waited), for d in all.
func (w *watchdog) enter(phase int32, d time.Duration) {
	if w == nil || w.fired.Load() != 0 {
		return
	}
	w.phase.Store(phase)
	w.limit = d
	if phase == phaseBody {
		w.t.Stop()
		w.left = d
		return
	}
	w.t.Reset(d)
}

// streaming switches to (or restarts) the stream_idle phase.
func (w *watchdog) streaming(d time.Duration) { w.enter(phaseIdle, d) }

// waiting starts a wait for the replica in phaseBody: the timer runs with
// what is left of the limit.
func (w *watchdog) waiting() {
	if w == nil || w.fired.Load() != 0 || w.phase.Load() != phaseBody {
		return
	}
	w.since = time.Now()
	w.t.Reset(w.left)
}

// waited ends a wait started by waiting.
func (w *watchdog) waited() {
	if w == nil || w.since.IsZero() {
		return
	}
	w.t.Stop()
	w.left -= time.Since(w.since)
	w.since = time.Time{}
}

func (w *watchdog) stop() {
	if w != nil {
		w.t.Stop()
	}
}

func (w *watchdog) expired() bool { return w != nil && w.fired.Load() != 0 }

// what says which timeout expired, for the client and the log.
func (w *watchdog) what() string {
	switch w.fired.Load() {
	case phaseHeaders:
		return fmt.Sprintf("upstream replica sent no response headers within %s (timeouts.response_header)", w.limit)
	case phaseIdle:
		return fmt.Sprintf("upstream replica sent nothing for %s (timeouts.stream_idle)", w.limit)
	case phaseBody:
		return fmt.Sprintf("upstream replica kept its reply waiting for %s after its headers (timeouts.stream_idle)", w.limit)
	}
	return fmt.Sprintf("upstream replica sent no first token within %s (timeouts.first_token)", w.limit)
}
