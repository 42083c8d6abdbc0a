package emulator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/traces"
)

// Layout says how the farm's replicas are served.
type Layout uint8

const (
	// LayoutURLs serves each replica on its own listener, as vLLM servers
	// started with --data-parallel-rank k (external load balancing).
	LayoutURLs Layout = iota
	// LayoutDP serves every replica from one listener, as one vLLM server
	// with --data-parallel-size N: a request picks its rank with the
	// X-data-parallel-rank header, else vLLM's own balancer picks one.
	LayoutDP
)

// ParseLayout reads "urls" or "dp".
func ParseLayout(s string) (Layout, error) {
	switch s {
	case "urls":
		return LayoutURLs, nil
	case "dp":
		return LayoutDP, nil
	}
	return 0, fmt.Errorf("layout %q: want urls or dp", s)
}

func (l Layout) String() string {
	if l == LayoutDP {
		return "dp"
	}
	return "urls"
}

// Options configure an Emulator.
type Options struct {
	Layout Layout
	// Speed multiplies time: the model's virtual time runs Speed times
	// faster than the wall clock (10: TTFT and step times divided by 10).
	// 0 means 1.
	Speed float64
	// Seed seeds the answers' text (the same seed and prompt give the same
	// answer) and the faults' draws.
	Seed uint64
	// Faults are the failures the replicas inject (none by default).
	Faults Faults
	// APIServerTime and APIServerPerKToken are vLLM's API server's work
	// on a request before its engine sees it, in model time: a fixed part
	// plus this much per 1,000 prompt tokens (traces.Workload's fields of
	// the same names). 0 takes traces.DefaultWorkload's; negative: none.
	APIServerTime      time.Duration
	APIServerPerKToken time.Duration
	// KVEvents, when its Form is set, makes every engine publish vLLM's
	// KV-cache events over ZeroMQ (kvevents.go). New binds the sockets;
	// Serve closes them when it returns.
	KVEvents KVEventsOptions
}

// RankHeader is the header by which a client picks a data-parallel rank.
const RankHeader = "X-data-parallel-rank"

// Emulator serves a farm's replicas over HTTP in wall time, each replica
// being the simulator's replica model (sim.EngineReplica).
type Emulator struct {
	farm        *sim.Farm
	opts        Options
	model       string
	maxModelLen int
	created     int64 // Unix seconds, for the response objects
	clock       *clock
	engines     []*engine

	lbMu  sync.Mutex      // vLLM's front end (LayoutDP without a rank header)
	lb    *sim.DPFrontEnd // nil: one engine, or a MoE model (no balancer modelled)
	lbErr error           // why lb is nil with several engines

	stopping chan struct{} // closed when Serve begins to stop
	served   sync.Once
}

// New returns an emulator of farm f. Its clock starts now; Serve serves it.
func New(f *sim.Farm, opts Options) (*Emulator, error) {
	if opts.Speed == 0 {
		opts.Speed = 1
	}
	if !(opts.Speed >= 1e-3) || opts.Speed > 1e6 {
		return nil, fmt.Errorf("speed %g: want a factor in [0.001, 1e6]", opts.Speed)
	}
	def := traces.DefaultWorkload()
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&opts.APIServerTime, def.APIServerTime}, {&opts.APIServerPerKToken, def.APIServerPerKToken}} {
		switch {
		case *d.v == 0:
			*d.v = d.def
		case *d.v < 0:
			*d.v = 0
		}
	}
	bs := f.Spec.VLLM.BlockSize
	if bs%traces.TextBlockTokens != 0 {
		return nil, fmt.Errorf("vllm.block_size %d: the emulator needs a multiple of %d (its prompt blocks)", bs, traces.TextBlockTokens)
	}
	now := time.Now()
	e := &Emulator{
		farm:     f,
		opts:     opts,
		model:    f.Spec.Model,
		created:  now.Unix(),
		clock:    &clock{start: now, speed: opts.Speed},
		stopping: make(chan struct{}),
	}
	e.maxModelLen = f.KVTokensPerReplica()
	switch {
	case f.Spec.VLLM.MaxModelLen > 0:
		e.maxModelLen = min(e.maxModelLen, f.Spec.VLLM.MaxModelLen)
	case f.Model.MaxPositionTokens > 0:
		e.maxModelLen = min(e.maxModelLen, f.Model.MaxPositionTokens)
	}
	n := f.Spec.Replicas
	for i := range n {
		e.engines = append(e.engines, newEngine(i, sim.NewEngineReplica(f, i), e.clock, f.Spec.VLLM.MaxModelLen))
	}
	if err := e.openKVEvents(opts.KVEvents); err != nil {
		return nil, err
	}
	if n > 1 && opts.Layout == LayoutDP {
		// A MoE model has none modelled: requests must then name a rank.
		e.lb, e.lbErr = sim.NewDPFrontEnd(f, opts.Seed)
	}
	return e, nil
}

// Model is the served model name.
func (e *Emulator) Model() string { return e.model }

// Replicas is the number of replicas (data-parallel ranks).
func (e *Emulator) Replicas() int { return len(e.engines) }

// MaxModelLen is the longest prompt plus output a request may ask for:
// the farm's max_model_len (else the model's context), at most one
// replica's KV cache.
func (e *Emulator) MaxModelLen() int { return e.maxModelLen }

// Listeners returns how many listeners Serve takes: one per replica
// (LayoutURLs) or one (LayoutDP).
func (e *Emulator) Listeners() int {
	if e.opts.Layout == LayoutDP {
		return 1
	}
	return len(e.engines)
}

// Handler returns the HTTP handler of listener i (see Listeners).
func (e *Emulator) Handler(i int) http.Handler {
	if e.opts.Layout == LayoutDP {
		return e.newServer(e.engines)
	}
	return e.newServer(e.engines[i : i+1])
}

// shutdownGrace bounds how long Serve waits for handlers after ctx is done.
const shutdownGrace = 5 * time.Second

// Serve runs the engines and serves lns (Listeners of them, in order) until
// ctx is done, then stops: streams in progress end at once (without their
// final event), the listeners close and every goroutine it started has
// returned when it returns. An emulator is served once.
func (e *Emulator) Serve(ctx context.Context, lns []net.Listener) error {
	if len(lns) != e.Listeners() {
		return fmt.Errorf("emulator: %d listeners for layout %s, want %d", len(lns), e.opts.Layout, e.Listeners())
	}
	first := false
	e.served.Do(func() { first = true })
	if !first {
		return errors.New("emulator: already served")
	}
	runCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, eng := range e.engines {
		wg.Go(func() { eng.run(runCtx) })
	}
	servers := make([]*http.Server, len(lns))
	errc := make(chan error, len(lns))
	for i, ln := range lns {
		srv := &http.Server{Handler: e.Handler(i), ReadHeaderTimeout: 10 * time.Second, ConnContext: e.connContext}
		servers[i] = srv
		wg.Go(func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		})
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	close(e.stopping)
	sctx, scancel := context.WithTimeout(context.Background(), shutdownGrace)
	for _, srv := range servers {
		if serr := srv.Shutdown(sctx); serr != nil {
			_ = srv.Close()
		}
	}
	scancel()
	cancel()
	wg.Wait()
	return errors.Join(err, e.closeKVEvents())
}

// pick chooses the rank of a LayoutDP request: the X-data-parallel-rank
// header when it is an integer (a non-integer is ignored, as vLLM does),
// else vLLM's front end (sim.DPFrontEnd: the API server its connection
// reached, balancing as the farm's vLLM release does, in model time). It
// returns the engine and the API server (-1 when none balanced).
func (e *Emulator) pick(engines []*engine, h http.Header, server int) (*engine, int, error) {
	if len(engines) == 1 {
		return engines[0], -1, nil
	}
	if v := h.Get(RankHeader); v != "" {
		if rank, ok := parseRank(strings.TrimSpace(v)); ok {
			if rank < 0 || rank >= len(engines) {
				return nil, -1, badRequest("", "data_parallel_rank %d is out of range [0, %d).", rank, len(engines))
			}
			return engines[rank], -1, nil
		}
	}
	if e.lb == nil {
		return nil, -1, badRequest("", "send X-data-parallel-rank: %v", e.lbErr)
	}
	e.lbMu.Lock()
	defer e.lbMu.Unlock()
	if server < 0 {
		server = e.lb.Dial() // no connection known (a handler served directly): a new one
	}
	now := e.clock.virtual().Microseconds()
	i := e.lb.Pick(server, now, func(i int) (int, int, float64, int64) {
		st := engines[i].stats()
		return st.Waiting, st.Running, st.KVUsage, st.Steps
	})
	return engines[i], server, nil
}

// finished tells vLLM's front end that a request API server placed on
// eng has finished (its own in-flight count, from vLLM 0.27).
func (e *Emulator) finished(server int, eng *engine) {
	if e.lb == nil || server < 0 {
		return
	}
	e.lbMu.Lock()
	e.lb.Finished(server, eng.index)
	e.lbMu.Unlock()
}

// connServerKey keys the API server a connection reached in its context.
type connServerKey struct{}

// connContext gives each new connection its API server, as the kernel's
// SO_REUSEPORT hash does for vLLM's api_server_count servers.
func (e *Emulator) connContext(ctx context.Context, _ net.Conn) context.Context {
	if e.lb == nil {
		return ctx
	}
	e.lbMu.Lock()
	k := e.lb.Dial()
	e.lbMu.Unlock()
	return context.WithValue(ctx, connServerKey{}, k)
}

// connServer is the API server of the connection ctx belongs to, -1 when
// it has none.
func connServer(ctx context.Context) int {
	if k, ok := ctx.Value(connServerKey{}).(int); ok {
		return k
	}
	return -1
}

// parseRank reads a decimal integer, as Python's int() would.
func parseRank(v string) (int, bool) {
	n, neg, i := 0, false, 0
	if v != "" && (v[0] == '-' || v[0] == '+') {
		neg, i = v[0] == '-', 1
	}
	if i == len(v) || len(v) > 9 {
		return 0, false
	}
	for ; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
		n = n*10 + int(v[i]-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}
