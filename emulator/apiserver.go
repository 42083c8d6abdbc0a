package emulator

import (
	"context"
	"errors"
	"sync"
	"time"
)

// apiServer is vLLM's OpenAI API server in front of the engines: it
// templates and tokenises one request at a time before the engine sees it
// (the simulator's sim/apiserver.go cites vLLM's code), so a request waits
// for the work queued on its server before its own, in the model's time,
// as the simulator's requests do.
type apiServer struct {
	mu   sync.Mutex
	free time.Duration // the model time at which the work queued ends
}

// reserve queues work at model time now and returns when it ends.
func (a *apiServer) reserve(now, work time.Duration) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	at := max(now, a.free) + work
	a.free = at
	return at
}

// errStopping is a wait cut by the emulator stopping.
var errStopping = errors.New("emulator: stopping")

// tokenise waits, in wall time, until one of s's API servers is done with
// a request of prompt tokens: ctx's error if the client goes away first.
// A one-replica server has one API server; a data-parallel one has
// vllm.api_server_count, taken in turn (vLLM's kernel spreads connections
// over them).
func (s *server) tokenise(ctx context.Context, prompt int) error {
	work := s.e.apiWork(prompt)
	if work <= 0 {
		return nil
	}
	a := s.apis[int(s.nextAPI.Add(1)-1)%len(s.apis)]
	c := s.e.clock
	d := c.wallUntil(a.reserve(c.virtual(), work))
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.e.stopping:
		return errStopping
	}
}

// apiWork is an API server's work on a request of prompt tokens, in model
// time (Options.APIServerTime, APIServerPerKToken).
func (e *Emulator) apiWork(prompt int) time.Duration {
	return e.opts.APIServerTime + time.Duration(float64(e.opts.APIServerPerKToken)*float64(prompt)/1000)
}
