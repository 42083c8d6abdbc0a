package live

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lm-warden/warden/placement"
)

// Admission (a model's admission: kv): a new conversation whose expected
// footprint fits on no replica (placement's Decision.Wait) waits here, in
// arrival order, until a conversation ends or goes idle; conversations
// already admitted never wait. The queue is guarded by the model's mu and
// shared with its successors on a reload (handover), as the table is.
// Only the front waiter asks placement again: when a request finishes
// (its footprint is observed) and at every scrape interval (a finished
// turn's return timeout ends, conversations leave the active window), it
// is woken; once placed it wakes the next. The KV a conversation holds is
// counted from its request until its return timeout after the request
// ended (placement's "Held conversations": the gaps it left between its
// turns, as TCP estimates a retransmission timeout), not until it leaves
// the active window: a finished conversation frees its room within
// seconds. A waiter
// whose client goes away or whose admission_timeout passes leaves the
// queue, the latter refused with 429 / 529 overloaded_error and
// Retry-After.

// admissionQueue is the FIFO of waiting requests: placement's WaitQueue
// (the simulator's too) of one channel each, buffered so that a wake-up
// never blocks. Each waiter times its own admission_timeout.
type admissionQueue struct {
	waiting placement.WaitQueue[chan struct{}]
	// waits counts the requests that joined the queue, timeouts those of
	// them refused after admission_timeout (status and /metrics).
	waits, timeouts int64
	// spills is the last few reasons a later turn left its home (status);
	// kept here because it is shared with a reload's successor as the queue is.
	spills spillRing
}

// spillRingSize is how many spill reasons a model keeps for its status.
const spillRingSize = 8

// SpillReason is one later turn that left its home: when, from and to
// which replica, and why ("home 9 in flight > 8", "priced: home 4.1 s vs
// 1.2 s elsewhere"). No session id.
type SpillReason struct {
	Time   time.Time `json:"time"`
	From   int       `json:"from"`
	To     int       `json:"to"`
	Reason string    `json:"reason"`
}

// spillRing keeps the last spillRingSize spill reasons. Guarded by the
// model's mu.
type spillRing struct {
	buf  [spillRingSize]SpillReason
	next int // total recorded
}

func (r *spillRing) add(s SpillReason) {
	r.buf[r.next%spillRingSize] = s
	r.next++
}

// last returns the recorded reasons, newest first.
func (r *spillRing) last() []SpillReason {
	n := min(r.next, spillRingSize)
	out := make([]SpillReason, 0, n)
	for k := 1; k <= n; k++ {
		out = append(out, r.buf[(r.next-k)%spillRingSize])
	}
	return out
}

// spillText says why decision d moved a later turn off home h: the prices
// a priced decision compared, else home's load against the threshold.
func spillText(d placement.Decision, home placement.Replica, threshold int) string {
	switch {
	case d.HomeTTFT > 0 || d.ElsewhereTTFT > 0:
		return fmt.Sprintf("priced: home %.1f s vs %.1f s elsewhere", d.HomeTTFT, d.ElsewhereTTFT)
	case !home.Healthy:
		return "home unavailable"
	}
	return fmt.Sprintf("home %d in flight > %d", home.InFlight, threshold)
}

// errAdmissionTimeout: a new conversation waited admission_timeout for KV
// headroom and is refused.
var errAdmissionTimeout = errors.New("no replica has KV cache room for a new conversation")

// enqueue adds a waiter at the back, waiting since now. Called with m.mu
// held.
func (q *admissionQueue) enqueue(now time.Time) chan struct{} {
	ch := make(chan struct{}, 1)
	q.waiting.Push(ch, now)
	return ch
}

// position is ch's index in the queue, -1 if absent. Called with m.mu held.
func (q *admissionQueue) position(ch chan struct{}) int {
	return q.waiting.Index(func(w chan struct{}) bool { return w == ch })
}

// remove takes ch out of the queue and wakes the new front when ch was
// the front. Called with m.mu held.
func (q *admissionQueue) remove(ch chan struct{}) {
	if q.waiting.Remove(func(w chan struct{}) bool { return w == ch }) == 0 {
		q.wake()
	}
}

// wake tells the front waiter to ask placement again. Called with m.mu held.
func (q *admissionQueue) wake() {
	if front, _, ok := q.waiting.Front(); ok {
		select {
		case front <- struct{}{}:
		default: // already told
		}
	}
}

// admissionRetryAfter is the Retry-After, in seconds, of a request
// refused after its admission wait (placement.AdmissionRetryAfter, which
// the simulator's replay retries after too).
const admissionRetryAfter = int(placement.AdmissionRetryAfter / time.Second)

// errMustWait is pick's answer for a request that must wait.
var errMustWait = errors.New("wait for admission")

// placeAdmitted is place for a model with admission: kv. A request that
// must wait joins the queue and is placed when it reaches the front and
// fits; it returns errAdmissionTimeout after timeout, or the context's
// error when the client goes away.
func (m *model) placeAdmitted(ctx context.Context, r *placement.Request, start time.Time, timeout time.Duration, clock func() time.Time) (picked, error) {
	var ch chan struct{}
	var deadline, tick <-chan time.Time
	for {
		p, err := m.placeQueued(ctx, r, clock(), ch)
		if !errors.Is(err, errMustWait) {
			if ch != nil {
				m.leaveQueue(ch)
			}
			return p, err
		}
		if ch == nil {
			m.mu.Lock()
			ch = m.adm.enqueue(clock())
			m.adm.waits++
			m.mu.Unlock()
			t := time.NewTimer(timeout - clock().Sub(start))
			defer t.Stop()
			deadline = t.C
			// A wake-up can fall between the failed ask and the enqueue, and
			// conversations leave the active window without a request: ask
			// again at every scrape interval too.
			tk := time.NewTicker(max(m.interval, 10*time.Millisecond))
			defer tk.Stop()
			tick = tk.C
		}
		select {
		case <-ch:
		case <-tick:
		case <-ctx.Done():
			m.leaveQueue(ch)
			return picked{}, ctx.Err()
		case <-deadline:
			m.mu.Lock()
			m.adm.timeouts++
			m.mu.Unlock()
			m.leaveQueue(ch)
			return picked{}, fmt.Errorf("%w within admission_timeout %s", errAdmissionTimeout, timeout)
		}
	}
}

// placeQueued is one attempt of placeAdmitted: waiter ch (nil: not queued
// yet) may ask placement only at the front of the queue, and a request not
// queued must join the back of a non-empty queue if it is a new
// conversation.
func (m *model) placeQueued(ctx context.Context, r *placement.Request, now time.Time, ch chan struct{}) (picked, error) {
	m.mu.Lock()
	l := m.current()
	ahead := l.adm.waiting.Len()
	if ch != nil {
		ahead = l.adm.position(ch)
	}
	must := l.router.MustQueue(r, ahead, now)
	m.mu.Unlock()
	if must {
		return picked{}, errMustWait
	}
	return m.place(ctx, r, now)
}

// leaveQueue takes ch out of the queue (placed, refused or gone).
func (m *model) leaveQueue(ch chan struct{}) {
	m.mu.Lock()
	m.adm.remove(ch)
	m.mu.Unlock()
}

// observe records that a request of session (placed by pick, which
// started it in the table) ended at now, with the conversation's
// footprint, prompt + answer tokens from the response's usage (0: none
// known), and wakes the front waiter. The conversation stays held for its
// return timeout (placement's "Held conversations"), then no longer counts
// against its home's KV headroom unless it sends again: a conversation
// that finished frees its room within seconds, not after the active
// window. session "" (a request that was no turn) only wakes.
func (m *model) observe(session string, tokens int, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.current()
	l.router.Ended(session, tokens, now) // an observer table records homes, not footprints
	l.adm.wake()
}

// observeHits records what replica rep served of a request of session
// from its prefix cache, from the answer's usage (its cached tokens:
// OpenAI's prompt_tokens_details.cached_tokens or input_tokens_details,
// Anthropic's cache_read_input_tokens; -1 when the replica reports none),
// for placement's cold-at-home rule (placement/observed.go). A rehome
// decided on it is counted when the next turn is placed.
func (m *model) observeHits(session string, rep *replica, u Usage) {
	if session == "" || u.PromptTokens <= 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.current()
	if !l.router.KeepsHomes() {
		return // an observer table follows homes, not what they hold
	}
	cached := u.CachedTokens
	switch {
	case cached >= 0:
		rep.reportsCached.Store(true)
	case rep.reportsCached.Load():
		cached = 0 // vLLM omits prompt_tokens_details when nothing was cached
	}
	if i := l.index(rep); i >= 0 {
		l.router.Served(session, i, u.PromptTokens, cached, u.OutputTokens)
	}
}

// endSession forgets session (a keyed hash) at once: its home, its
// footprint and its hold, so that its room counts free for admission and
// the KV balance now rather than after its return timeout, and wakes the
// front waiter. It reports whether the table knew it.
func (m *model) endSession(session string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.current()
	ok := l.router.Forget(session)
	l.adm.wake()
	return ok
}

// admissionOn reports whether new conversations of m may wait.
func (m *model) admissionOn() bool {
	return m.router.Traits().Has(placement.TraitAdmission)
}
