package sim

import (
	"github.com/lm-warden/warden/traces"
)

// closedLoop is N concurrent clients, each running one session at a time:
// a turn is sent when the previous answer has reached the client plus the
// client's turnaround and the turn's think time; when a session ends, the
// client starts the next one from the source, so the number of sessions in
// progress stays N until the source runs out.
//
// Steps follow one another as the product's bench runs them: moving from N
// to M sessions starts M-N new clients, or retires N-M (each finishes the
// turn it has in flight and sends no more), while the others carry on, so
// sessions span step boundaries and complete even in short steps at high
// load. Only the end of the last step cuts the requests in flight; the
// epoch in each send event tells a send from before that cut.
//
// A synthetic workload's sessions come with their subagents (a
// traces.FamilySource): when a parent's request that spawned some
// finishes, each starts on a client of its own, side by side, while the
// parent waits; the parent sends its next turn (their answers) once the
// last of them is done. Subagents are not counted in N: N is the number of
// top-level sessions, as an operator counts agent sessions. A trace's
// sessions (a SliceSource) list subagents as sessions of their own, run
// one after another like any other.
type closedLoop struct {
	src       traces.SessionSource
	fam       traces.FamilySource // src, when it hands out sessions with their subagents
	outputCap int                 // the workload's max_output_tokens (finished_reason "length"); 0 unknown
	// turnaroundUs is the client's time from reading an answer's end to
	// sending the next turn (before the think time).
	turnaroundUs int64
	clients      []client
	epoch        int32
	active       int // clients with a session
	exhausted    bool
}

type client struct {
	sess     traces.Session
	turn     int
	home     int
	last     int32 // the replica its last request was placed on, -1: none yet
	conn     int32 // its own connection's API server (connections: session), -1: none yet
	active   bool
	retiring bool // sends no further turn: the step's level went down
	// parent is a subagent's parent's slot, -1 for a top-level session;
	// waiting counts a parent's subagents still running; spawned is how
	// many of its session's Subagents have started.
	parent  int32
	waiting int32
	spawned int
}

// newClient is a client running s as a top-level session.
func newClient(s traces.Session) client {
	return client{sess: s, home: -1, last: -1, conn: -1, active: true, parent: -1}
}

const slotBits = 16 // a send event's arg: epoch<<slotBits | slot

// maxClients bounds the concurrency of a closed loop.
const maxClients = 1<<slotBits - 1

func sendArg(epoch int32, slot int) int32 { return epoch<<slotBits | int32(slot) }

// cut invalidates every client: their queued sends and the requests they
// have in flight no longer count.
func (c *closedLoop) cut() { c.epoch++ }

// begin starts n clients at the current instant.
func (c *closedLoop) begin(r *run, n int) {
	c.clients = c.clients[:0]
	c.active = 0
	c.resize(r, n)
}

// resize makes n clients run sessions from now on: it starts new ones or
// retires the newest running ones. Retired slots are reused by later
// growth once their last turn is done.
func (c *closedLoop) resize(r *run, n int) {
	running := 0
	for k := range c.clients {
		cl := &c.clients[k]
		if cl.active && !cl.retiring && cl.parent < 0 {
			running++
		}
	}
	for k := len(c.clients) - 1; k >= 0 && running > n; k-- {
		cl := &c.clients[k]
		if cl.active && !cl.retiring && cl.parent < 0 {
			cl.retiring = true
			running--
		}
	}
	for k := 0; k < len(c.clients) && running < n; k++ {
		if cl := &c.clients[k]; !cl.active {
			c.nextSession(r, k)
			running++
		}
	}
	for running < n && len(c.clients) < maxClients {
		c.clients = append(c.clients, client{home: -1, last: -1, conn: -1, parent: -1})
		c.nextSession(r, len(c.clients)-1)
		running++
	}
}

// freeSlot returns a client slot with no session, growing the clients
// when none is free, or -1 at maxClients.
func (c *closedLoop) freeSlot() int {
	for k := range c.clients {
		if !c.clients[k].active {
			return k
		}
	}
	if len(c.clients) >= maxClients {
		return -1
	}
	c.clients = append(c.clients, client{home: -1, last: -1, conn: -1, parent: -1})
	return len(c.clients) - 1
}

// spawn starts the subagents client k's session spawned after its request
// just done (turn-1), each on a free client, and reports how many.
func (c *closedLoop) spawn(r *run, k int) int {
	n := 0
	for {
		cl := &c.clients[k]
		if cl.spawned >= len(cl.sess.Subagents) || cl.sess.Subagents[cl.spawned].ParentTurn != cl.turn-1 {
			return n
		}
		sub := cl.sess.Subagents[cl.spawned]
		cl.spawned++
		if len(sub.Turns) == 0 {
			continue
		}
		slot := c.freeSlot()
		if slot < 0 {
			continue // at the bound of clients: the parent does without
		}
		cl = &c.clients[k] // freeSlot may have moved the clients
		sc := newClient(sub)
		sc.parent = int32(k)
		if sub.Turns[0].Session == cl.sess.Turns[0].Session {
			// It carries its parent's session id: the router sees later
			// turns of the parent's conversation, at home there.
			sc.home = cl.home
		}
		c.clients[slot] = sc
		c.active++
		cl.waiting++
		n++
		c.queue(r, slot, r.downlinkUs+c.turnaroundUs)
	}
}

// subagentDone ends client k's subagent session; its parent sends its
// next turn once the last of its subagents is done.
func (c *closedLoop) subagentDone(r *run, k int) {
	cl := &c.clients[k]
	c.endSession(r, cl)
	p := cl.parent
	cl.active, cl.parent = false, -1
	c.active--
	pc := &c.clients[p]
	if pc.waiting--; pc.waiting == 0 && pc.active {
		c.queue(r, int(p), r.downlinkUs+c.turnaroundUs)
	}
}

// endSession tells the record of hashes ever cached that cl's session is
// over. The router is not told, as the proxy is not (no agent says its
// conversation is over): it saw the last request end (Router.Ended) and
// holds the conversation for its return timeout, as after any turn.
func (c *closedLoop) endSession(r *run, cl *client) {
	r.sessionOver(&cl.sess)
}

// rejectBackoff is how long a client whose request was rejected (longer
// than a replica's whole KV cache) waits before it starts its next session,
// so that a workload of impossible requests still lets time advance.
const rejectBackoff = usPerSec

// nextSession gives client k its next session and queues its first turn.
func (c *closedLoop) nextSession(r *run, k int) { c.nextSessionAfter(r, k, 0) }

// nextSessionAfter is nextSession with the first turn delayed by delay µs.
func (c *closedLoop) nextSessionAfter(r *run, k int, delay int64) {
	cl := &c.clients[k]
	if cl.active {
		cl.active = false
		c.active--
	}
	if c.exhausted || cl.retiring {
		cl.retiring = false
		return
	}
	var s traces.Session
	var ok bool
	if c.fam != nil {
		s, ok = c.fam.NextFamily()
	} else {
		s, ok = c.src.NextSession()
	}
	if !ok || len(s.Turns) == 0 {
		c.exhausted = !ok
		if ok {
			c.nextSessionAfter(r, k, delay) // skip an empty session
		}
		return
	}
	*cl = newClient(s)
	c.active++
	c.queue(r, k, delay)
}

// queue sends client k's current turn after its think time plus delay µs.
func (c *closedLoop) queue(r *run, k int, delay int64) {
	t := &c.clients[k].sess.Turns[c.clients[k].turn]
	think := max(t.ThinkMs, 0) * usPerMs
	r.rt.pausedUs += think
	r.ev.push(r.now+delay+think, evSend, sendArg(c.epoch, k))
}

func (c *closedLoop) send(r *run, arg int32) {
	if arg>>slotBits != c.epoch {
		return // a send queued before the step was cut
	}
	k := int(arg & (1<<slotBits - 1))
	cl := &c.clients[k]
	if cl.retiring {
		cl.active, cl.retiring = false, false
		c.active--
		r.sessionOver(&cl.sess)
		return
	}
	s := r.newSeq(&cl.sess.Turns[cl.turn], int32(k), c.outputCap)
	s.epoch = c.epoch
	if r.front != nil {
		s.apiServer = r.front.connect(&cl.conn)
	}
	r.dispatch(s)
}

func (c *closedLoop) arrive(r *run, s *seq) {
	r.submit(s, &c.clients[s.client].home)
}

func (c *closedLoop) done(r *run, s *seq, finished bool) {
	r.releaseConn(s)
	if s.epoch != c.epoch {
		return // cut at the end of an earlier step
	}
	k := int(s.client)
	cl := &c.clients[k]
	r.rt.requestUs += r.now + r.downlinkUs - s.clientSentUs
	if !finished {
		// Rejected (too long for the KV cache, or refused after waiting
		// for admission): the session is abandoned.
		if cl.parent >= 0 {
			c.subagentDone(r, k)
			return
		}
		c.endSession(r, cl)
		c.nextSessionAfter(r, k, rejectBackoff)
		return
	}
	cl.turn++
	if cl.turn >= len(cl.sess.Turns) {
		if cl.parent >= 0 {
			c.subagentDone(r, k)
			return
		}
		r.rt.sessionsCompleted++
		c.endSession(r, cl)
		c.nextSessionAfter(r, k, r.downlinkUs+c.turnaroundUs)
		return
	}
	if cl.retiring {
		c.endSession(r, cl)
		cl.active, cl.retiring = false, false
		c.active--
		return
	}
	if c.spawn(r, k) > 0 {
		return // the parent's next turn waits for its subagents
	}
	c.queue(r, k, r.downlinkUs+c.turnaroundUs)
}

// idle reports whether no client has anything left to do.
func (c *closedLoop) idle() bool { return c.exhausted && c.active == 0 }

// newClosedLoopFor is e's closed loop on r: the synthetic sessions of e's
// workload, or the trace's sessions, over the clients' network.
func newClosedLoopFor(e *Experiment, r *run) *closedLoop {
	var src traces.SessionSource
	outputCap := 0
	if e.Trace == nil {
		src = traces.NewGenerator(e.Workload, e.Farm.Spec.VLLM.BlockSize, e.Seed)
		outputCap = e.Workload.MaxOutputTokens
	} else {
		src = traces.NewSliceSource(e.Trace.sessions())
	}
	r.clientNetwork(e.Workload)
	c := &closedLoop{src: src, outputCap: outputCap, turnaroundUs: micros(e.Workload.ClientTurnaround)}
	c.fam, _ = src.(traces.FamilySource)
	return c
}

// steps runs a step per sessions level of e, back to back on the same
// replicas (a trace's closed loop: one, until its sessions are done); only
// the last step's end cuts the requests in flight, unless e.FreshSteps:
// then every step's end cuts them and the next step starts all its
// sessions at once, as warden bench --fresh-steps does.
func (c *closedLoop) steps(st *stepper, e *Experiment) error {
	r := st.r
	// As the proxy: the router sees each request leave and end
	// (Table.Start and Finish), never the end of a conversation.
	r.router.TurnEnds = true
	levels := e.Sessions
	if e.Trace != nil {
		levels = levels[:1]
		r.stopWhenIdle = true
	}
	for i, n := range levels {
		r.stepSessions = n
		if i == 0 || e.FreshSteps {
			c.begin(r, n)
		} else {
			c.resize(r, n)
		}
		r.stopped, r.stopQueued = false, false
		if err := st.runFor(micros(e.Duration)); err != nil {
			return err
		}
		if i < len(levels)-1 && !e.FreshSteps {
			st.closeWindow(n, func() int { return 0 }) // the load carries on
			continue
		}
		st.closeWindow(n, func() int { c.cut(); return r.abortAll() })
	}
	return nil
}

// openLoop replays requests at their recorded arrival times, divided by a
// speed factor, whatever the farm's progress.
type openLoop struct {
	reqs  []*traces.Request
	speed float64
	homes map[string]int // session -> replica of its first turn (lookups only)
	next  int            // next request to queue
	left  int            // requests routed and not yet done
}

func (o *openLoop) arrival(i int) int64 {
	return int64(float64(o.reqs[i].ArrivalMs) * usPerMs / o.speed)
}

// begin queues the first arrival.
func (o *openLoop) begin(r *run) {
	if len(o.reqs) > 0 {
		r.ev.push(o.arrival(0), evSend, 0)
	}
}

func (o *openLoop) send(r *run, arg int32) {
	i := int(arg)
	req := o.reqs[i]
	if i+1 < len(o.reqs) {
		r.ev.push(max(o.arrival(i+1), r.now), evSend, int32(i+1))
	}
	o.next = i + 1
	home, ok := o.homes[req.Session]
	if !ok {
		home = -1
	}
	s := r.newSeq(req, -1, 0)
	o.left++
	if r.submit(s, &home) && req.Turn == 0 {
		o.homes[req.Session] = home
	}
}

// arrive is never called: a replay's arrival times are the engine's, so
// send submits at once.
func (o *openLoop) arrive(r *run, s *seq) { r.submit(s, nil) }

func (o *openLoop) done(r *run, s *seq, finished bool) {
	o.left--
}

func (o *openLoop) idle() bool { return o.next >= len(o.reqs) && o.left == 0 }

// steps replays the trace in one step, until its last request is done (or
// e's duration).
func (o *openLoop) steps(st *stepper, e *Experiment) error {
	r := st.r
	r.stopWhenIdle = true
	sessions := countSessions(o.reqs)
	r.stepSessions = sessions
	o.begin(r)
	if err := st.runFor(micros(e.Duration)); err != nil {
		return err
	}
	st.closeWindow(sessions, func() int {
		o.next = len(o.reqs) // nothing more is sent
		return r.abortAll()
	})
	return nil
}

// sessionReplay replays a trace session by session: each session starts at
// its first request's recorded arrival (divided by the speed-up) and sends
// each later turn when the previous answer has reached the client, plus
// the client's turnaround and the turn's recorded think time (divided by
// the speed-up too), as an agent does. The trace gives when conversations
// begin, their prompts and their pauses; the farm gives the pace of their
// turns, so a slower routing delays a session's later turns instead of
// piling them up.
//
// As the proxy, the router is told when each request is sent and when it
// ends (placement.Router.TurnEnds: Table.Start at its placement, Table.Finish at its
// end with its prompt + answer tokens, as live/call.go's call.finish),
// never that a conversation has ended: a conversation holds KV headroom
// while a request of it is in flight and, after, for its return timeout
// (placement's "Held conversations": RFC 6298's SRTT + 4 RTTVAR of the
// gaps between its turns, at least placement.MinHold, at most the active
// window); then admission counts its room free, as the proxy's does.
//
// A first turn refused after its admission wait (429 / 529 with
// Retry-After in the proxy) is sent again as the clients' SDKs do
// (sdkMaxRetries); a turn rejected (too long for the KV cache: a 400,
// which the SDKs do not retry) or refused once more after the last retry
// ends its session: its client gives up, as in the closed loop.
type sessionReplay struct {
	sessions     []traces.Session // in order of first arrival
	startsUs     []int64
	speed        float64
	turnaroundUs int64
	clients      []client
	left         int  // sessions not yet ended
	cut          bool // the run's end cut the requests in flight: send nothing more
}

// sdkMaxRetries is how many times a session replay's client sends a
// request again after the proxy refused it for admission, waiting the
// Retry-After (placement.AdmissionRetryAfter) before each: the default of
// both SDKs agents are built on. anthropic-sdk-python
// src/anthropic/_constants.py DEFAULT_MAX_RETRIES = 2, and
// src/anthropic/_base_client.py: _should_retry retries 408, 409, 429 and
// every status >= 500 (so 529 overloaded_error) unless x-should-retry says
// otherwise; _calculate_retry_timeout sleeps the Retry-After (or
// retry-after-ms) when 0 < it <= 60 s, else an exponential back-off from
// INITIAL_RETRY_DELAY 0.5 s; the request loop (for retries_taken in
// range(max_retries + 1)) then raises the last error. openai-python
// src/openai/_constants.py DEFAULT_MAX_RETRIES = 2 and _base_client.py
// likewise, honouring a Retry-After up to MAX_RETRY_AFTER_DELAY 120 s.
// The proxy's 5 s is honoured by both, exactly (no jitter), so a refused
// first turn is tried three times in all.
const sdkMaxRetries = 2

func newSessionReplay(t *Trace, speed float64, turnaroundUs int64) *sessionReplay {
	p := &sessionReplay{sessions: t.sessions(), speed: speed, turnaroundUs: turnaroundUs}
	p.startsUs = make([]int64, len(p.sessions))
	p.clients = make([]client, len(p.sessions))
	for k, s := range p.sessions {
		p.startsUs[k] = int64(float64(s.Turns[0].ArrivalMs) * usPerMs / speed)
		p.clients[k] = client{sess: s, home: -1, conn: -1, active: true}
	}
	p.left = len(p.sessions)
	return p
}

// steps replays the sessions in one step, until they are done (or e's
// duration), with the clients' network and their SDKs' retries, and the
// router told when each request starts and ends, as the proxy is.
func (p *sessionReplay) steps(st *stepper, e *Experiment) error {
	r := st.r
	r.router.TurnEnds = true // as the proxy: Table.Start and Finish around each request
	r.clientRetries = sdkMaxRetries
	r.clientNetwork(e.Workload)
	r.stopWhenIdle = true
	r.stepSessions = len(p.sessions)
	p.begin(r)
	if err := st.runFor(micros(e.Duration)); err != nil {
		return err
	}
	st.closeWindow(len(p.sessions), func() int {
		p.cut = true // nothing more is sent
		return r.abortAll()
	})
	return nil
}

// begin queues every session's first turn at its recorded arrival.
func (p *sessionReplay) begin(r *run) {
	for k := range p.sessions {
		r.ev.push(p.startsUs[k], evSend, int32(k))
	}
}

func (p *sessionReplay) send(r *run, arg int32) {
	if p.cut {
		return
	}
	cl := &p.clients[arg]
	s := r.newSeq(&cl.sess.Turns[cl.turn], arg, 0)
	if r.front != nil {
		s.apiServer = r.front.connect(&cl.conn)
	}
	r.dispatch(s)
}

func (p *sessionReplay) arrive(r *run, s *seq) { r.submit(s, &p.clients[s.client].home) }

func (p *sessionReplay) done(r *run, s *seq, finished bool) {
	r.releaseConn(s)
	if p.cut {
		return
	}
	k := int(s.client)
	cl := &p.clients[k]
	if finished {
		cl.turn++
	}
	if !finished || cl.turn >= len(cl.sess.Turns) {
		if finished {
			r.rt.sessionsCompleted++
		}
		cl.active = false
		p.left--
		return
	}
	think := int64(float64(max(cl.sess.Turns[cl.turn].ThinkMs, 0)) * usPerMs / p.speed)
	r.ev.push(r.now+r.downlinkUs+p.turnaroundUs+think, evSend, int32(k))
}

func (p *sessionReplay) idle() bool { return p.left == 0 }
