package sim

import (
	"math/rand/v2"
	"time"

	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/traces"
)

// This file is vLLM's own front end of a data-parallel server, what the
// "least-loaded" strategy means in the product's benchmark (affinity off):
//
//   - vllm/entrypoints/cli/serve.py: with --data-parallel-size N and internal
//     load balancing, api_server_count defaults to N: N API server processes
//     share the port through SO_REUSEPORT, so the kernel hashes each new
//     client connection onto one of them, and every request on that
//     connection goes through that server.
//   - vllm/v1/engine/core_client.py DPLBAsyncMPClient: each server places
//     a request on the engine with the lowest 4 x waiting + running, scanning
//     from its own fixed eng_start_index, on counts it got from the
//     coordinator plus its own local increments (placement.NewDPLBClient).
//   - vllm/v1/engine/coordinator.py CoordinatorProc.process_input_socket:
//     each engine sends its [waiting, running] counts after every busy-loop
//     iteration that changed them (core.py, after the step); the
//     coordinator publishes them to every server when its poll times out:
//     at once if the last publication is stats_update_interval (100 ms) old
//     or more, else when it becomes that old.
//
// How client connections map onto servers is the client's doing
// (traces.Workload.Connections): one per session, a new one per request, or
// a pool as Go's http.Transport keeps (an idle connection is reused, the
// most recently returned first; a new one is dialled when none is idle).
type dpFrontend struct {
	servers    []*placement.LeastLoaded
	published  placement.Snapshot // the coordinator's last publication
	reported   []placement.Replica
	dirty      bool
	intervalUs int64
	lastUs     int64      // the last publication, µs; far in the past at first
	queued     bool       // an evPublish is queued
	rng        *rand.Rand // which server the kernel gives a new connection
	mode       string
	idle       []int32 // pool: idle connections' servers, most recent last
}

// newDPFrontend returns the front end of n engines behind servers API
// servers, publishing every interval µs.
func newDPFrontend(n, servers int, intervalUs int64, mode string, seed uint64) *dpFrontend {
	f := &dpFrontend{
		published:  placement.Snapshot{Replicas: make([]placement.Replica, n)},
		reported:   make([]placement.Replica, n),
		intervalUs: intervalUs,
		lastUs:     -intervalUs,
		rng:        rand.New(rand.NewPCG(seed, 0x6470_6c62)), // "dplb"
		mode:       mode,
	}
	for i := range n {
		f.published.Replicas[i] = placement.Replica{ID: i, Healthy: true}
		f.reported[i] = placement.Replica{ID: i, Healthy: true}
	}
	for k := range servers {
		f.servers = append(f.servers, placement.NewDPLBClient(k, servers, n))
	}
	return f
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
// changed or a publication is already due.
func (f *dpFrontend) stepEnded(rep *replica, nowUs int64) int64 {
	p := &f.reported[rep.id]
	w, run := rep.waiting.len(), len(rep.running)
	if p.Waiting == w && p.Running == run {
		return -1
	}
	p.Waiting, p.Running = w, run
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
	f.dirty = false
	f.lastUs = nowUs
	copy(f.published.Replicas, f.reported)
	f.published.Generation++
}

// pick places r through server k.
func (f *dpFrontend) pick(k int32, r *placement.Request, nowUs int64) (placement.Decision, error) {
	if k < 0 || int(k) >= len(f.servers) {
		k = 0
	}
	return f.servers[k].Pick(r, &f.published, time.UnixMicro(nowUs))
}
