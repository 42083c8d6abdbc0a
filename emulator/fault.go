package emulator

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Faults are the failures an emulated replica injects, so that a proxy's
// handling of them can be rehearsed on one machine (`warden emulate
// --fault`). Each probability is drawn per inference request, independently
// and deterministically: the draw of the n-th inference request a server
// receives depends only on the emulator's seed, the server (its first
// replica) and n, so the same seed and the same arrival order give the
// same faults. At most one fault hits a request; error-503 is drawn first,
// then stall-after-headers, then die-mid-stream.
type Faults struct {
	// StallAfterHeaders is the probability that a request gets its
	// response headers (200, the stream's or the JSON's content type) and
	// then nothing more until the client leaves or the emulator stops:
	// /health still answers 200, as a wedged vLLM's does. The request never
	// reaches the engine.
	StallAfterHeaders float64
	// Error503 is the probability that a request is answered 503 in
	// vLLM's error shape (the Anthropic shape on /v1/messages).
	Error503 float64
	// DieMidStream is the probability that the connection closes halfway
	// through the answer: a stream after half its tokens (at least one),
	// without its end; a JSON answer after half its bytes. The engine
	// request is aborted.
	DieMidStream float64
	// SlowMetrics delays every /metrics answer by this much.
	SlowMetrics time.Duration
}

// The names of the faults in --fault.
const (
	FaultStallAfterHeaders = "stall-after-headers"
	FaultError503          = "error-503"
	FaultSlowMetrics       = "slow-metrics"
	FaultDieMidStream      = "die-mid-stream"
)

var faultNames = []string{FaultStallAfterHeaders, FaultError503, FaultSlowMetrics, FaultDieMidStream}

// ParseFaults reads a comma-separated list of name=value items:
// stall-after-headers=P, error-503=P, die-mid-stream=P (P a probability in
// [0, 1]) and slow-metrics=D (a Go duration >= 0, "1.5s"). "" is no fault.
// An error names the item at fault.
func ParseFaults(s string) (Faults, error) {
	var f Faults
	if strings.TrimSpace(s) == "" {
		return f, nil
	}
	seen := map[string]bool{}
	for i, item := range strings.Split(s, ",") {
		bad := func(format string, args ...any) (Faults, error) {
			return Faults{}, fmt.Errorf("item %d %q: %s", i+1, item, fmt.Sprintf(format, args...))
		}
		name, value, ok := strings.Cut(strings.TrimSpace(item), "=")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if !ok || name == "" || value == "" {
			return bad("want name=value (names: %s)", strings.Join(faultNames, ", "))
		}
		if seen[name] {
			return bad("%s given twice", name)
		}
		seen[name] = true
		switch name {
		case FaultSlowMetrics:
			d, err := time.ParseDuration(value)
			if err != nil || d < 0 {
				return bad("%s wants a duration >= 0 such as 2s, got %q", name, value)
			}
			f.SlowMetrics = d
		case FaultStallAfterHeaders, FaultError503, FaultDieMidStream:
			p, err := strconv.ParseFloat(value, 64)
			if err != nil || !(p >= 0 && p <= 1) {
				return bad("%s wants a probability in [0, 1], got %q", name, value)
			}
			switch name {
			case FaultStallAfterHeaders:
				f.StallAfterHeaders = p
			case FaultError503:
				f.Error503 = p
			default:
				f.DieMidStream = p
			}
		default:
			return bad("unknown fault %q (want %s)", name, strings.Join(faultNames, ", "))
		}
	}
	return f, nil
}

// String is the --fault text of f (the faults it injects, in a fixed
// order; "" for none); ParseFaults reads it back.
func (f Faults) String() string {
	var parts []string
	prob := func(name string, p float64) {
		if p > 0 {
			parts = append(parts, name+"="+strconv.FormatFloat(p, 'g', -1, 64))
		}
	}
	prob(FaultStallAfterHeaders, f.StallAfterHeaders)
	prob(FaultError503, f.Error503)
	if f.SlowMetrics > 0 {
		parts = append(parts, FaultSlowMetrics+"="+f.SlowMetrics.String())
	}
	prob(FaultDieMidStream, f.DieMidStream)
	return strings.Join(parts, ",")
}

// fault is what happens to one inference request.
type fault uint8

const (
	faultNone fault = iota
	faultError503
	faultStall
	faultDie
)

// draw decides the fault of the n-th inference request of server (its
// first replica's index).
func (f *Faults) draw(seed uint64, server int, n uint64) fault {
	for _, c := range []struct {
		p    float64
		kind fault
	}{{f.Error503, faultError503}, {f.StallAfterHeaders, faultStall}, {f.DieMidStream, faultDie}} {
		if c.p > 0 && uniform(seed, uint64(server), n, uint64(c.kind)) < c.p {
			return c.kind
		}
	}
	return faultNone
}

// uniform is a deterministic draw in [0, 1) from its arguments (splitmix64
// over their mix).
func uniform(xs ...uint64) float64 {
	var h uint64 = 0x9e3779b97f4a7c15
	for _, x := range xs {
		h = splitmix64(h ^ x)
	}
	return float64(h>>11) / (1 << 53)
}

func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// stall answers the headers of a response and then nothing until the
// client leaves or the emulator stops.
func (s *server) stall(w http.ResponseWriter, ctx context.Context, stream bool) {
	if stream {
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		w.Header().Set("Cache-Control", "no-cache")
	} else {
		w.Header().Set("Content-Type", "application/json")
	}
	w.WriteHeader(http.StatusOK)
	_ = http.NewResponseController(w).Flush()
	select {
	case <-ctx.Done():
	case <-s.e.stopping:
	}
}

// slowMetrics delays h by the slow-metrics fault.
func (s *server) slowMetrics(h http.Handler) http.Handler {
	d := s.e.opts.Faults.SlowMetrics
	if d <= 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			return
		case <-s.e.stopping:
			return
		}
		h.ServeHTTP(w, r)
	})
}

// dieHalfway writes the headers of a JSON answer v and half its bytes,
// then closes the connection (the die-mid-stream fault on a non-streamed
// request); it does not return.
func dieHalfway(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		b = []byte(`{}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b[:len(b)/2])
	_ = http.NewResponseController(w).Flush()
	panic(http.ErrAbortHandler) // net/http closes the connection
}
