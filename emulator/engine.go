package emulator

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/traces"
)

// engine is one emulated vLLM engine (one data-parallel rank): a
// sim.EngineReplica, whose virtual time follows the wall clock times the
// speed, and the streams of the requests it holds. Its driver goroutine
// (run) ends every step when its virtual time comes; handlers submit and
// abort requests. mu guards everything below it.
type engine struct {
	index int
	clock *clock
	kick  chan struct{} // wakes the driver: the next step end may have changed

	mu      sync.Mutex
	eng     *sim.EngineReplica
	streams map[int]*stream // by engine request id
	// hists are vLLM's histograms (sim.EngineHistogramDescs order), which
	// eng observes in model time exactly as a simulated engine does.
	hists []*histogram
	// kv publishes the engine's KV-cache events (nil: none); flushKV
	// sends what each Advance cached and evicted.
	kv *kvPublisher
}

func (e *engine) flushKV() {
	if e.kv != nil {
		e.kv.flush()
	}
}

// newEngine wraps eng, recording its histograms with token buckets up to
// maxModelLen (the farm's vllm.max_model_len, as the simulator's).
func newEngine(index int, eng *sim.EngineReplica, c *clock, maxModelLen int) *engine {
	e := &engine{
		index:   index,
		clock:   c,
		kick:    make(chan struct{}, 1),
		eng:     eng,
		streams: map[int]*stream{},
	}
	eng.Record(sim.NewEngineHistograms(maxModelLen, func(d sim.HistogramDesc) sim.Observer {
		h := newHistogram(d.Buckets)
		e.hists = append(e.hists, h)
		return h
	}))
	return e
}

// stream carries one request's engine events to its handler. The engine
// appends under the stream's own lock and never blocks; the handler drains.
type stream struct {
	id     int
	notify chan struct{} // cap 1: events are waiting

	mu     sync.Mutex
	events []sim.EngineEvent
}

// take returns the events queued so far and empties the queue.
func (s *stream) take(dst []sim.EngineEvent) []sim.EngineEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	dst = append(dst, s.events...)
	s.events = s.events[:0]
	return dst
}

// emit hands an engine event to its stream. Called with e.mu held.
func (e *engine) emit(ev sim.EngineEvent) {
	s := e.streams[ev.ID]
	if s == nil {
		return
	}
	if ev.Kind == sim.EventFinished || ev.Kind == sim.EventAborted {
		delete(e.streams, ev.ID)
	}
	s.mu.Lock()
	s.events = append(s.events, ev)
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// submit enqueues req now and returns its stream.
func (e *engine) submit(req *traces.Request, outputCap int) (*stream, error) {
	e.mu.Lock()
	now := e.clock.virtual()
	e.eng.Advance(now, e.emit) // steps due before the arrival end first
	id, err := e.eng.Submit(req, outputCap)
	if err != nil {
		e.flushKV()
		e.mu.Unlock()
		return nil, err
	}
	s := &stream{id: id, notify: make(chan struct{}, 1)}
	e.streams[id] = s
	e.eng.Advance(now, e.emit) // an idle engine starts its step at the arrival
	e.flushKV()
	e.mu.Unlock()
	e.wake()
	return s, nil
}

// abort cuts a request whose client went away.
func (e *engine) abort(s *stream) {
	e.mu.Lock()
	e.eng.Abort(s.id, e.emit)
	e.flushKV()
	e.mu.Unlock()
	e.wake()
}

func (e *engine) wake() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// stats reads the engine's gauges and counters.
func (e *engine) stats() sim.EngineStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.eng.Stats()
}

// run is the engine's driver: it advances the model to the wall clock's
// virtual time, sleeps until the step in flight ends (or a submission
// wakes it) and repeats until ctx is done.
func (e *engine) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		e.mu.Lock()
		e.eng.Advance(e.clock.virtual(), e.emit)
		e.flushKV()
		next, busy := e.eng.NextStepEnd()
		e.mu.Unlock()
		wait := time.Hour
		if busy {
			wait = max(e.clock.wallUntil(next), 0)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-e.kick:
		case <-timer.C:
		}
	}
}

// clock maps wall time to the model's virtual time: virtual = (wall -
// start) x speed.
type clock struct {
	start time.Time
	speed float64
}

func (c *clock) virtual() time.Duration {
	return time.Duration(float64(time.Since(c.start)) * c.speed)
}

// wallUntil is the wall time left until virtual time v.
func (c *clock) wallUntil(v time.Duration) time.Duration {
	at := c.start.Add(time.Duration(float64(v) / c.speed))
	return time.Until(at)
}

// histogram is a classic cumulative histogram; its owner locks it.
type histogram struct {
	bounds []float64
	counts []uint64 // per bucket, not cumulative; last is +Inf
	sum    float64
	n      uint64
}

func newHistogram(bounds []float64) *histogram {
	return &histogram{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

// Observe counts v in the first bucket whose bound is >= v (NaN and
// values above every bound: +Inf), as metrics.Histogram and client_golang
// do.
func (h *histogram) Observe(v float64) {
	i := sort.SearchFloat64s(h.bounds, v)
	h.counts[i]++
	h.sum += v
	h.n++
}

// cumulative returns the upper bound -> cumulative count map of
// client_golang's const histograms.
func (h *histogram) cumulative() map[float64]uint64 {
	m := make(map[float64]uint64, len(h.bounds))
	var c uint64
	for i, b := range h.bounds {
		c += h.counts[i]
		m[b] = c
	}
	return m
}
