package live

import (
	"context"
	"fmt"
	"github.com/lm-warden/warden/live/upstream"
	"io"
	"strconv"
	"sync/atomic"
	"time"
)

// maxUsageBody bounds how much of a non-streamed response is kept to read
// its usage.
const maxUsageBody = 1 << 20

// bodyBase is what both kinds of response body share: closing one
// releases the attempt (its in-flight count, its context, its timers) and
// records the usage and the time to the first byte or token.
type bodyBase struct {
	rc     io.ReadCloser
	c      *call
	a      *attempt
	ctx    context.Context    // the client's
	cancel context.CancelFunc // the attempt's context
	dog    *watchdog          // streamed requests: first_token, then stream_idle; nil otherwise

	drained   *atomic.Bool // the drain deadline cancelled the attempt
	stopDrain func() bool  // stops watching for the drain deadline
}

func (b *bodyBase) upstreamFailed(kind string) {
	b.a.rep.upErrors.Add(1)
	b.c.srv.obs.upstreamErrors.WithLabelValues(b.c.m.cfg.Name, strconv.Itoa(b.a.rep.id), kind).Inc()
}

// close closes the backend's body and releases the attempt.
func (b *bodyBase) close() error {
	err := b.rc.Close()
	b.dog.stop()
	b.stopDrain()
	b.cancel()
	b.a.release()
	return err
}

func (b *bodyBase) observeTTFB() {
	if t := b.c.ttfb.Load(); t > 0 && !b.c.countTokens { // count_tokens is in no TTFB series
		b.c.srv.obs.ttfb.WithLabelValues(b.c.m.cfg.Name).Observe(time.Duration(t).Seconds())
	}
}

// plainBody is a response that is not an event stream, or one encoded by
// the replica (Content-Encoding): it passes through as it comes, and an
// identity-encoded one is kept (up to maxUsageBody) for its usage. It is
// timed by its watchdog: the time spent waiting for the replica after the
// headers (phaseBody) or, for an encoded event stream (gaps), the wait
// for each read (the first token's timeout before the first byte). A
// timeout counts against the replica (a strike) and fails the read with
// errStalled, which forward answers with 504 in the client's shape if
// nothing was sent yet.
type plainBody struct {
	bodyBase
	usageBuf  []byte // the body so far, while whole and at most maxUsageBody
	usageOver bool   // the body outgrew maxUsageBody, or is encoded: usage unknown
	first     bool
	gaps      bool          // an encoded event stream: each read within idle
	idle      time.Duration // timeouts.stream_idle
	failed    bool          // the failure was counted
}

func (b *plainBody) Read(p []byte) (int, error) {
	b.dog.waiting()
	n, err := b.rc.Read(p)
	b.dog.waited()
	if n > 0 {
		if !b.first {
			b.first = true
			b.c.ttfb.CompareAndSwap(0, int64(max(time.Since(b.c.start), 1)))
			b.a.prefilled() // the answer is being sent: its prefill is done
		}
		if b.gaps {
			b.dog.streaming(b.idle)
		}
		// Keep the body only while it is whole: a skipped chunk would
		// leave a gap that could still parse.
		if !b.usageOver && len(b.usageBuf)+n <= maxUsageBody {
			b.usageBuf = append(b.usageBuf, p[:n]...)
		} else {
			b.usageOver, b.usageBuf = true, nil
		}
	}
	switch {
	case err == io.EOF:
		if b.c.status < 500 && !b.failed {
			b.c.m.succeeded(b.a.rep) // the whole reply came
		}
	case err != nil && b.ctx.Err() == nil && !b.failed:
		b.failed = true
		if b.dog.expired() {
			b.upstreamFailed("timeout")
			b.c.srv.transportStrike(b.c, b.a.rep)
			err = fmt.Errorf("%w: %s", errStalled, b.dog.what())
			b.c.srv.log.Warn("upstream timed out", "model", b.c.m.cfg.Name, "replica", b.a.rep.id, "err", err)
		} else {
			b.upstreamFailed("stream")
		}
	}
	return n, err
}

func (b *plainBody) Close() error {
	err := b.close()
	if len(b.usageBuf) > 0 && !b.usageOver {
		b.c.usage = bodyUsage(b.c.api, b.usageBuf)
	}
	b.observeTTFB()
	return err
}

// streamBody is an event stream. It notes the first output token and the
// usage, and it passes on only whole events, so that if the backend fails
// mid-stream it can end the stream with the API's own error event (and no
// [DONE] or message_stop) instead of a torn event.
type streamBody struct {
	bodyBase
	watch *streamWatch
	idle  time.Duration // timeouts.stream_idle

	rbuf  []byte // read buffer
	held  []byte // bytes after the last complete event
	obuf  []byte // out's own buffer, when out is not a slice of rbuf
	out   []byte // bytes ready for the client
	final bool   // no more bytes after out
	err   error  // returned after out when final
	torn  bool   // out ended inside an event (an overlong event passed on in part)
}

func newStreamBody(base bodyBase, idle time.Duration) *streamBody {
	c := base.c
	a := base.a
	return &streamBody{bodyBase: base, idle: idle, rbuf: upstream.CopyBuffers.Get(),
		watch: newStreamWatch(c.api, func() {
			c.ttfb.CompareAndSwap(0, int64(max(time.Since(c.start), 1)))
			a.prefilled()
		})}
}

func (b *streamBody) Read(p []byte) (int, error) {
	for {
		if len(b.out) > 0 {
			n := copy(p, b.out)
			b.out = b.out[n:]
			return n, nil
		}
		if b.final {
			return 0, b.err
		}
		n, err := b.rc.Read(b.rbuf)
		if n > 0 {
			b.take(b.rbuf[:n])
		}
		if err != nil {
			b.end(err)
		}
	}
}

// take watches a chunk from the backend and moves what ends in a whole
// event to out; the rest waits in held.
func (b *streamBody) take(chunk []byte) {
	_, _ = b.watch.Write(chunk)
	cut := b.watch.frame.LastEnd()
	// Progress is a whole event: a replica trickling bytes that never
	// end one does not hold the stream open.
	if cut >= 0 && (b.watch.firstToken || !b.c.stream) {
		b.dog.streaming(b.idle)
	}
	switch {
	case cut >= 0 && len(b.held) == 0:
		b.out = chunk[:cut] // rbuf is not read into again before out is drained
		b.held = append(b.held, chunk[cut:]...)
		b.torn = false
	case cut >= 0:
		b.obuf = append(append(b.obuf[:0], b.held...), chunk[:cut]...)
		b.out = b.obuf
		b.held = append(b.held[:0], chunk[cut:]...)
		b.torn = false
	default:
		b.held = append(b.held, chunk...)
		if len(b.held) > maxSSELine {
			b.obuf, b.held = b.held, b.obuf[:0]
			b.out = b.obuf
			b.torn = true
		}
	}
}

// end handles the backend's body ending with err: a clean end passes the
// rest on; anything else ends the stream with the API's error event.
func (b *streamBody) end(err error) {
	switch {
	case b.ctx.Err() != nil:
		b.final, b.err = true, err // the client is gone
	case err == io.EOF && (b.watch.terminal || b.watch.upstreamErr):
		b.out = append(b.out, b.held...) // a clean end
		b.held = nil
		b.final, b.err = true, io.EOF
		if b.watch.terminal {
			b.c.m.succeeded(b.a.rep)
		}
	default:
		// Died mid-stream, stalled, or ended without its final event.
		msg := "upstream replica failed mid-stream"
		switch {
		case b.drained.Load():
			msg = "the proxy is shutting down: its drain deadline (timeouts.drain) ended the stream"
		case b.dog.expired():
			msg = b.dog.what()
			b.upstreamFailed("timeout")
			b.c.srv.transportStrike(b.c, b.a.rep)
		case err == io.EOF:
			msg = "upstream replica ended the stream early"
			b.upstreamFailed("stream")
		default:
			b.upstreamFailed("stream")
		}
		b.c.srv.log.Warn("stream broken", "model", b.c.m.cfg.Name, "replica", b.a.rep.id, "err", err)
		switch {
		case b.torn:
			// The client holds part of an event: end it, or the error
			// event would be read as more of its last line.
			b.out = append(b.out, "\n\n"...)
		case b.watch.frame.PendingLF() && len(b.held) == 0:
			// The client's last event ended in a CR: a LF makes it a
			// CRLF, for clients that split lines at LF only.
			b.out = append(b.out, '\n')
		}
		b.out = append(b.out, streamErrorEvent(b.c.api, msg, b.watch.nextSeq)...)
		b.held = nil
		b.final, b.err = true, io.EOF
	}
}

func (b *streamBody) Close() error {
	err := b.close()
	if b.rbuf != nil {
		upstream.CopyBuffers.Put(b.rbuf) // out may be a slice of it: nothing reads after Close
		b.rbuf, b.out = nil, nil
	}
	b.c.usage = b.watch.usage
	b.observeTTFB()
	return err
}
