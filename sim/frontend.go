package sim

import (
	"errors"
	"math"
	"math/rand/v2"
	"time"

	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/traces"
)

// This file is vLLM's own front end of a data-parallel server, what the
// "least-loaded" strategy means in the product's benchmark (affinity off),
// as the release in vllm.version runs it (vllm.go: VLLMBehaviour.Balancer):
//
//   - vllm/entrypoints/cli/serve.py: with --data-parallel-size N and internal
//     load balancing, api_server_count defaults to N: N API server processes
//     share the port through SO_REUSEPORT, so the kernel hashes each new
//     client connection onto one of them, and every request on that
//     connection goes through that server.
//   - vllm/v1/engine/core_client.py DPLBAsyncMPClient
//     get_core_engine_for_request: each server scans the engines from its
//     eng_start_index (engines x client_index / client_count), keeps the
//     first with the strictly lowest score of its lb_engines, adds
//     client_count to that engine's local waiting count, and, since PR
//     #47420 (0.25), advances eng_start_index by one after every pick. The
//     score is 4 x waiting + running up to 0.26; from 0.27 (PR #49204)
//     max(client_count x the server's own unfinished requests on the
//     engine, waiting + running) + waiting x 6 x max(0, kv_cache_usage -
//     0.5) (apiServer.pick).
//   - vllm/v1/engine/core.py: only DPEngineCoreProc calls
//     _maybe_publish_request_counts after its steps. From 0.14 (PR #30739)
//     run_engine_core runs a dense model's ranks as plain EngineCoreProc
//     ("Non-MoE DP ranks are completely independent, so treat like DP=1"),
//     so up to 0.26 no engine reports a count; PR #49204 (0.27) publishes
//     from EngineCoreProc too.
//   - vllm/v1/engine/coordinator.py CoordinatorProc.process_input_socket:
//     the coordinator sends its counts to every server when its poll times
//     out: stats_update_interval (100 ms) after the last publication when a
//     count changed, else 5 s after it (DefaultRepublishInterval). Each
//     publication replaces a server's lb_engines, and with it every local
//     increment. With no engine reporting, it republishes zeros every 5 s:
//     each server then balances on its own increments only, a rotation
//     blind to load and to caches, which sends the turns of a conversation
//     to engines that have never seen it (vllm#52463).
//
// How client connections map onto servers is the client's doing
// (traces.Workload.Connections): one per session, a new one per request, or
// a pool as Go's http.Transport keeps (an idle connection is reused, the
// most recently returned first; a new one is dialled when none is idle).
type dpFrontend struct {
	balancer    DPBalancer
	servers     []apiServer
	published   []engineCounts // the coordinator's last publication
	gen         uint64         // publications so far
	reported    []engineCounts // what the engines last reported
	dirty       bool
	intervalUs  int64
	republishUs int64
	lastUs      int64      // the last publication, µs; far in the past at first
	queued      bool       // an evPublish of a change is queued
	rng         *rand.Rand // which server the kernel gives a new connection
	mode        string
	idle        []int32 // pool: idle connections' servers, most recent last
}

// engineCounts is what the coordinator knows of one engine.
type engineCounts struct {
	waiting, running int
	kvUsage          float64 // from 0.27: kv_cache_usage, 0..1
}

// apiServer is one API server's DPLBAsyncMPClient.
type apiServer struct {
	start    int            // eng_start_index
	gen      uint64         // the publication lb belongs to
	lb       []engineCounts // lb_engines, local increments added to waiting
	inFlight []int          // engine_inflight: its own unfinished requests (0.27)
}

// Publication events: a change the coordinator forwards, or its idle
// republication (the poll's 5 s timeout).
const (
	publishChange    = 0
	publishRepublish = 1
)

// newDPFrontend returns the front end of n engines behind servers API
// servers, publishing changes every interval µs, as balancer b runs it.
func newDPFrontend(n, servers int, intervalUs int64, b VLLMBehaviour, mode string, seed uint64) *dpFrontend {
	f := &dpFrontend{
		balancer:    b.Balancer,
		published:   make([]engineCounts, n),
		reported:    make([]engineCounts, n),
		intervalUs:  intervalUs,
		republishUs: b.RepublishIntervalUs,
		lastUs:      -max(intervalUs, b.RepublishIntervalUs),
		rng:         rand.New(rand.NewPCG(seed, 0x6470_6c62)), // "dplb"
		mode:        mode,
	}
	if f.republishUs <= 0 {
		f.republishUs = DefaultRepublishInterval
	}
	servers = max(servers, 1)
	for k := range servers {
		f.servers = append(f.servers, apiServer{
			start:    n * k / servers,
			lb:       make([]engineCounts, n),
			inFlight: make([]int, n),
		})
	}
	return f
}

// publishes reports whether the engines report their counts.
func (f *dpFrontend) publishes() bool {
	return f.balancer == DPPublishedFixed || f.balancer == DPPublishedInFlight
}

// dial is a new client connection: the kernel's SO_REUSEPORT hash picks
// its server.
func (f *dpFrontend) dial() int32 { return int32(f.rng.IntN(len(f.servers))) }

// connect returns the server of the connection a request goes out on;
// sessionConn is the session's own connection (-1 before its first).
func (f *dpFrontend) connect(sessionConn *int32) int32 {
	if sessionConn == nil {
		return f.dial()
	}
	switch f.mode {
	case traces.ConnectionsSession:
		if *sessionConn < 0 {
			*sessionConn = f.dial()
		}
		return *sessionConn
	case traces.ConnectionsRequest:
		return f.dial()
	}
	if n := len(f.idle); n > 0 {
		c := f.idle[n-1]
		f.idle = f.idle[:n-1]
		return c
	}
	return f.dial()
}

// release returns a request's connection once its answer is read.
func (f *dpFrontend) release(server int32) {
	if f.mode == traces.ConnectionsPool && server >= 0 {
		f.idle = append(f.idle, server)
	}
}

// stepEnded records an engine's counts as its step ends, at nowUs. It
// returns when the coordinator publishes them: nowUs when the last
// publication is old enough, else a later instant, or -1 when nothing
// changed, a publication is already due, or the engines report nothing.
func (f *dpFrontend) stepEnded(rep *replica, nowUs int64) int64 {
	if !f.publishes() {
		return -1
	}
	p := &f.reported[rep.id]
	w, run := rep.waiting.len(), len(rep.running)
	kv := 0.0
	if f.balancer == DPPublishedInFlight {
		kv = rep.pool.usage()
	}
	if p.waiting == w && p.running == run && p.kvUsage == kv {
		return -1
	}
	p.waiting, p.running, p.kvUsage = w, run, kv
	f.dirty = true
	if nowUs-f.lastUs >= f.intervalUs {
		f.publish(nowUs)
		return -1
	}
	if f.queued {
		return -1
	}
	f.queued = true
	return f.lastUs + f.intervalUs
}

// publish sends the changed counts to every server, replacing their local
// increments.
func (f *dpFrontend) publish(nowUs int64) {
	f.queued = false
	if !f.dirty {
		return
	}
	f.send(nowUs)
}

// republish is the coordinator's idle timer at nowUs: when no publication
// went out for the republication interval, it sends the counts it has
// again (all zero when no engine reports), which replaces every server's
// local increments. It returns when to look again.
func (f *dpFrontend) republish(nowUs int64) int64 {
	if nowUs-f.lastUs >= f.republishUs {
		f.send(nowUs)
	}
	return f.lastUs + f.republishUs
}

func (f *dpFrontend) send(nowUs int64) {
	f.dirty = false
	f.lastUs = nowUs
	copy(f.published, f.reported)
	f.gen++
}

// pick places r through server k.
func (f *dpFrontend) pick(k int32, r *placement.Request) (placement.Decision, error) {
	if k < 0 || int(k) >= len(f.servers) {
		k = 0
	}
	n := len(f.published)
	if r.Pinned >= 0 && r.Pinned < n {
		return placement.Decision{Replica: r.Pinned, Reason: placement.ReasonPinned}, nil
	}
	if n == 0 {
		return placement.Decision{}, errors.New("sim: a data-parallel front end with no engines")
	}
	s := &f.servers[k]
	if s.gen != f.gen {
		s.gen = f.gen
		copy(s.lb, f.published)
	}
	cc := len(f.servers)
	best, bestScore := 0, math.Inf(1)
	for i := range n {
		idx := (s.start + i) % n
		e := s.lb[idx]
		var score float64
		if f.balancer == DPPublishedInFlight {
			score = float64(max(cc*s.inFlight[idx], e.waiting+e.running))
			if e.waiting > 0 {
				score += float64(e.waiting) * 6 * max(0, e.kvUsage-0.5)
			}
		} else {
			score = float64(4*e.waiting + e.running)
		}
		if score < bestScore {
			best, bestScore = idx, score
		}
	}
	s.lb[best].waiting += cc
	if f.balancer == DPBlindRotating || f.balancer == DPPublishedInFlight {
		s.start = (s.start + 1) % n
	}
	s.inFlight[best]++
	return placement.Decision{Replica: best, Reason: placement.ReasonLeastLoaded}, nil
}

// finished is server k's engine_inflight count of engine e going down as
// a request it placed there finishes (process_engine_outputs).
func (f *dpFrontend) finished(k int32, e int) {
	if k < 0 || int(k) >= len(f.servers) {
		k = 0
	}
	if s := &f.servers[k]; e >= 0 && e < len(s.inFlight) && s.inFlight[e] > 0 {
		s.inFlight[e]--
	}
}

// DPFrontEnd is vLLM's data-parallel front end of a farm for a driver that
// keeps its own time (the emulator, in model time): the API servers, their
// scores and the coordinator of the release in vllm.version, as the
// simulator's least-loaded runs them, except that the coordinator's
// timers are looked at when a request is placed rather than when they
// fire. It is not safe for concurrent use.
type DPFrontEnd struct {
	f     *dpFrontend
	steps []int64 // each engine's steps when last looked at
}

// NewDPFrontEnd returns the front end of f's replicas behind
// vllm.api_server_count API servers; seed drives which server a new
// connection reaches. A mixture-of-experts model is refused: vLLM runs its
// ranks in lockstep waves, which are not modelled.
func NewDPFrontEnd(f *Farm, seed uint64) (*DPFrontEnd, error) {
	if f.Model.IsMoE() {
		return nil, &moeBalancerError{model: f.Model.Name}
	}
	v := f.Spec.VLLM
	return &DPFrontEnd{
		f:     newDPFrontend(f.Spec.Replicas, v.APIServerCount, time.Duration(v.StatsUpdateInterval).Microseconds(), f.Behaviour, traces.ConnectionsRequest, seed),
		steps: make([]int64, f.Spec.Replicas),
	}, nil
}

// Dial returns the API server a new client connection reaches (the
// kernel's SO_REUSEPORT hash).
func (d *DPFrontEnd) Dial() int { return int(d.f.dial()) }

// Pick places a request that reached API server k at nowUs and returns
// its engine. counts gives each engine's waiting and running requests, KV
// usage and steps run so far, for a release whose engines report their
// counts: an engine that stepped since the last look reported a change
// (its counts may have gone up and back down in between).
func (d *DPFrontEnd) Pick(k int, nowUs int64, counts func(engine int) (waiting, running int, kvUsage float64, steps int64)) int {
	f := d.f
	if f.publishes() {
		for i := range d.steps {
			w, r, kv, steps := counts(i)
			if f.balancer != DPPublishedInFlight {
				kv = 0
			}
			if c := (engineCounts{w, r, kv}); c != f.reported[i] || steps != d.steps[i] {
				f.reported[i], d.steps[i] = c, steps
				f.dirty = true
			}
		}
		if f.dirty && nowUs-f.lastUs >= f.intervalUs {
			f.send(nowUs)
		}
	}
	f.republish(nowUs)
	dec, _ := f.pick(int32(k), &placement.Request{Pinned: placement.NoPin}) // n > 0: never fails
	return dec.Replica
}

// Finished tells server k that a request it placed on engine finished.
func (d *DPFrontEnd) Finished(k, engine int) { d.f.finished(int32(k), engine) }
