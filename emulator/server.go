package emulator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lm-warden/warden/sim"
)

// maxBodyBytes bounds a request body.
const maxBodyBytes = 32 << 20

// server is the HTTP face of some engines: all of a LayoutDP server, or
// one of LayoutURLs.
type server struct {
	e       *Emulator
	engines []*engine
	mux     *http.ServeMux
	nextID  atomic.Uint64
	apis    []*apiServer // vLLM's API servers (apiserver.go)
	nextAPI atomic.Uint64
	faultN  atomic.Uint64 // inference requests that drew their faults
}

func (e *Emulator) newServer(engines []*engine) http.Handler {
	s := &server{e: e, engines: engines, mux: http.NewServeMux()}
	n := 1
	if len(engines) > 1 {
		n = max(1, e.farm.Spec.VLLM.APIServerCount)
	}
	for range n {
		s.apis = append(s.apis, new(apiServer))
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(e, engines))
	s.mux.Handle("GET /metrics", s.slowMetrics(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})))
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	s.mux.HandleFunc("GET /v1/models", s.models)
	s.mux.Handle("POST /v1/chat/completions", s.infer(APIChat))
	s.mux.Handle("POST /v1/completions", s.infer(APICompletions))
	s.mux.Handle("POST /v1/messages", s.infer(APIMessages))
	s.mux.Handle("POST /v1/responses", s.infer(APIResponses))
	s.mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"}) // FastAPI's answer
	})
	return s.mux
}

func (s *server) models(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID          string  `json:"id"`
		Object      string  `json:"object"`
		Created     int64   `json:"created"`
		OwnedBy     string  `json:"owned_by"`
		Root        string  `json:"root"`
		Parent      *string `json:"parent"`
		MaxModelLen int     `json:"max_model_len"`
	}
	writeJSON(w, http.StatusOK, struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", []model{{s.e.model, "model", s.e.created, "vllm", s.e.model, nil, s.e.maxModelLen}}})
}

// call is one inference request in progress.
type call struct {
	e       *Emulator
	api     API
	req     *Request
	id      string
	answer  string
	eng     *engine
	server  int // vLLM's API server that placed it, -1: none (a rank header, one engine)
	st      *stream
	cached  int
	gen     int
	capped  bool
	started bool // streaming: the first token's event went out
	seq     int  // Responses: the next event's sequence_number
	die     bool // the die-mid-stream fault: the connection closes halfway
}

// infer serves one inference endpoint.
func (s *server) infer(api API) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				writeError(w, api, &APIError{Status: http.StatusRequestEntityTooLarge, Message: fmt.Sprintf("request body over %d bytes", mbe.Limit)})
				return
			}
			writeError(w, api, badRequest("", "reading the body: %v", err))
			return
		}
		req, aerr := s.parse(api, body)
		if aerr != nil {
			writeError(w, api, aerr)
			return
		}
		f := s.e.opts.Faults.draw(s.e.opts.Seed, s.engines[0].index, s.faultN.Add(1))
		switch f {
		case faultError503:
			writeError(w, api, &APIError{Status: http.StatusServiceUnavailable,
				Message: "Service Unavailable (injected by warden emulate --fault error-503)"})
			return
		case faultStall:
			s.stall(w, r.Context(), req.Stream)
			return
		}
		if err := s.tokenise(r.Context(), req.PromptTokens); err != nil {
			if errors.Is(err, errStopping) {
				writeError(w, api, &APIError{Status: http.StatusServiceUnavailable, Message: "the server is shutting down"})
			}
			return // else the client went away
		}
		c, aerr := s.start(api, req, r.Header, connServer(r.Context()))
		if aerr != nil {
			writeError(w, api, aerr)
			return
		}
		defer s.e.finished(c.server, c.eng)
		c.die = f == faultDie
		if c.req.Stream {
			s.stream(w, r.Context(), c)
			return
		}
		s.complete(w, r.Context(), c)
	})
}

// parse reads and validates a request body of api against the served
// model and its context length.
func (s *server) parse(api API, body []byte) (*Request, *APIError) {
	req, err := ParseRequest(api, body)
	if err != nil {
		var ae *APIError
		if errors.As(err, &ae) {
			return nil, ae
		}
		return nil, badRequest("", "%v", err)
	}
	e := s.e
	if req.Model != "" && req.Model != e.model {
		return nil, &APIError{Status: http.StatusNotFound, Param: "model", Message: fmt.Sprintf("The model `%s` does not exist.", req.Model)}
	}
	if p := req.PromptTokens; p >= e.maxModelLen {
		return nil, badRequest("", "This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", e.maxModelLen, p)
	} else if p+req.MaxTokens > e.maxModelLen {
		return nil, badRequest(api.maxTokensParam(), "'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d).",
			req.MaxTokens, e.maxModelLen, p, req.MaxTokens, e.maxModelLen, p)
	}
	return req, nil
}

// start submits a parsed request to an engine.
func (s *server) start(api API, req *Request, h http.Header, apiServer int) (*call, *APIError) {
	e := s.e
	eng, apiServer, err := e.pick(s.engines, h, apiServer)
	if err != nil {
		var ae *APIError
		if errors.As(err, &ae) {
			return nil, ae
		}
		return nil, &APIError{Status: http.StatusServiceUnavailable, Message: err.Error()}
	}
	ereq, answer := engineRequest(api, req, e.opts.Seed, e.farm.Spec.VLLM.BlockSize)
	st, err := eng.submit(ereq, req.MaxTokens)
	if err != nil {
		return nil, badRequest("", "%v", err)
	}
	prefix := map[API]string{APIChat: "chatcmpl-", APICompletions: "cmpl-", APIMessages: "msg_", APIResponses: "resp_"}[api]
	id := fmt.Sprintf("%s%d-%d", prefix, eng.index, s.nextID.Add(1))
	return &call{e: e, api: api, req: req, id: id, answer: answer, eng: eng, st: st, server: apiServer}, nil
}

// wait returns the next events of c's stream; false when the client went
// away or the emulator stops (the request is then aborted).
func (s *server) wait(ctx context.Context, c *call, buf []sim.EngineEvent) ([]sim.EngineEvent, bool) {
	for {
		if buf = c.st.take(buf[:0]); len(buf) > 0 {
			return buf, true
		}
		select {
		case <-c.st.notify:
		case <-ctx.Done():
			c.eng.abort(c.st)
			return nil, false
		case <-s.e.stopping:
			c.eng.abort(c.st)
			return nil, false
		}
	}
}

// complete answers a non-streamed request once it finished.
func (s *server) complete(w http.ResponseWriter, ctx context.Context, c *call) {
	var buf []sim.EngineEvent
	for {
		var ok bool
		if buf, ok = s.wait(ctx, c, buf); !ok {
			return
		}
		for _, ev := range buf {
			c.note(ev)
			switch ev.Kind {
			case sim.EventFinished:
				if c.die {
					dieHalfway(w, c.response())
				}
				writeJSON(w, http.StatusOK, c.response())
				return
			case sim.EventAborted:
				writeError(w, c.api, &APIError{Status: http.StatusInternalServerError, Message: "request aborted"})
				return
			}
		}
	}
}

// note records what an event says about the request.
func (c *call) note(ev sim.EngineEvent) {
	c.gen = ev.Generated
	c.cached = ev.CachedTokens
	c.capped = ev.LengthCapped
}

// stream answers a streamed request as server-sent events, one token
// event per model token, written when the engine produces it.
func (s *server) stream(w http.ResponseWriter, ctx context.Context, c *call) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if c.api == APIResponses {
		_ = c.writeResponsesStart(w)
	}
	_ = rc.Flush()
	var buf []sim.EngineEvent
	for {
		var ok bool
		if buf, ok = s.wait(ctx, c, buf); !ok {
			return
		}
		for _, ev := range buf {
			c.note(ev)
			var err error
			switch ev.Kind {
			case sim.EventToken:
				err = c.writeToken(w)
			case sim.EventFinished:
				err = c.writeEnd(w)
				_ = rc.Flush()
				return
			case sim.EventAborted:
				_ = writeStreamError(w, c, "request aborted")
				_ = rc.Flush()
				return
			}
			if err != nil {
				c.eng.abort(c.st)
				return
			}
			if c.die && ev.Kind == sim.EventToken && c.gen >= max(1, c.req.MaxTokens/2) {
				_ = rc.Flush()
				c.eng.abort(c.st)
				panic(http.ErrAbortHandler) // net/http closes the connection: no final chunk
			}
		}
		if err := rc.Flush(); err != nil {
			c.eng.abort(c.st)
			return
		}
	}
}

// finishReason is the request's finish reason in its dialect.
func (c *call) finishReason() string {
	switch {
	case c.api == APIMessages && c.capped:
		return "max_tokens"
	case c.api == APIMessages:
		return "end_turn"
	case c.capped:
		return "length"
	}
	return "stop"
}

// text is the answer generated so far.
func (c *call) text() string { return c.answer[:c.gen*bytesPerToken] }

// token is the text of the last token generated.
func (c *call) token() string { return c.answer[(c.gen-1)*bytesPerToken : c.gen*bytesPerToken] }

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"detail":"encoding the response failed"}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
