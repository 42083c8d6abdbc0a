package live

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"unicode/utf8"
)

// API is the wire dialect of a request, which decides the shape of every
// error the proxy writes itself.
type API uint8

const (
	APIOpenAI    API = iota // /v1/chat/completions, /v1/completions
	APIResponses            // /v1/responses (OpenAI Responses API: its own stream events)
	APIAnthropic            // /v1/messages, /v1/messages/count_tokens
)

func (a API) String() string {
	switch a {
	case APIResponses:
		return "responses"
	case APIAnthropic:
		return "anthropic"
	}
	return "openai"
}

// errKind is the class of an error the proxy answers itself; each maps to an
// HTTP status and to each dialect's error type.
type errKind uint8

const (
	errInvalid         errKind = iota // 400
	errAuth                           // 401
	errNotFound                       // 404
	errTooLarge                       // 413
	errUnavailable                    // no replica can take it: 503 OpenAI, 529 Anthropic
	errUpstream                       // 502: backend failed before any byte reached the client
	errHeadersTooLarge                // 431
	errOverloaded                     // limits.max_in_flight reached: 429 OpenAI, 529 Anthropic
	errTimeout                        // 504: the backend sent no first token in time, before any byte reached the client
	errNoRoute                        // 404: no such path (errNotFound is an unknown model)
	errMethod                         // 405: a known path with the wrong method (the caller sets Allow)
	errMediaType                      // 415: a POST body whose Content-Type is not JSON
	errReadTimeout                    // 408: the client did not send its body within timeouts.read
)

func (k errKind) status(a API) int {
	switch k {
	case errAuth:
		return http.StatusUnauthorized
	case errNotFound, errNoRoute:
		return http.StatusNotFound
	case errMethod:
		return http.StatusMethodNotAllowed
	case errMediaType:
		return http.StatusUnsupportedMediaType
	case errReadTimeout:
		return http.StatusRequestTimeout
	case errTooLarge:
		return http.StatusRequestEntityTooLarge
	case errHeadersTooLarge:
		return http.StatusRequestHeaderFieldsTooLarge
	case errUnavailable:
		if a == APIAnthropic {
			return 529
		}
		return http.StatusServiceUnavailable
	case errUpstream:
		return http.StatusBadGateway
	case errTimeout:
		return http.StatusGatewayTimeout
	case errOverloaded:
		if a == APIAnthropic {
			return 529
		}
		return http.StatusTooManyRequests
	}
	return http.StatusBadRequest
}

func (k errKind) anthropicType() string {
	switch k {
	case errAuth:
		return "authentication_error"
	case errNotFound, errNoRoute:
		return "not_found_error"
	case errTooLarge, errHeadersTooLarge:
		return "request_too_large"
	case errUnavailable, errOverloaded:
		return "overloaded_error"
	case errUpstream, errTimeout:
		return "api_error"
	}
	return "invalid_request_error"
}

func (k errKind) openAI() (typ, code string) {
	switch k {
	case errAuth:
		return "invalid_request_error", "invalid_api_key"
	case errNotFound:
		return "invalid_request_error", "model_not_found"
	case errNoRoute:
		return "invalid_request_error", "not_found"
	case errMethod:
		return "invalid_request_error", "method_not_allowed"
	case errMediaType:
		return "invalid_request_error", "unsupported_media_type"
	case errReadTimeout:
		return "invalid_request_error", "request_timeout"
	case errTooLarge:
		return "invalid_request_error", "request_too_large"
	case errHeadersTooLarge:
		return "invalid_request_error", "request_header_fields_too_large"
	case errUnavailable:
		return "server_error", "service_unavailable"
	case errUpstream:
		return "server_error", "upstream_error"
	case errTimeout:
		return "server_error", "upstream_timeout"
	case errOverloaded:
		return "rate_limit_error", "rate_limit_exceeded"
	}
	return "invalid_request_error", "invalid_request"
}

type openAIError struct {
	Error openAIErrorBody `json:"error"`
}

type openAIErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

type anthropicError struct {
	Type  string               `json:"type"`
	Error anthropicErrorDetail `json:"error"`
}

type anthropicErrorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// errorBody renders an error in the dialect's JSON shape.
func errorBody(a API, k errKind, msg string) []byte {
	var v any
	if a == APIAnthropic {
		v = anthropicError{Type: "error", Error: anthropicErrorDetail{Type: k.anthropicType(), Message: msg}}
	} else {
		typ, code := k.openAI()
		v = openAIError{Error: openAIErrorBody{Message: msg, Type: typ, Code: code}}
	}
	b, _ := json.Marshal(v) // plain structs of strings: cannot fail
	return b
}

// writeError answers a request with an error in its dialect's shape.
func writeError(w http.ResponseWriter, a API, k errKind, msg string) {
	b := errorBody(a, k, msg)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(k.status(a))
	_, _ = w.Write(b)
}

// streamErrorEvent is the SSE event that ends a stream which failed after its
// first byte: OpenAI `data: {"error":...}` (no [DONE] after it), Anthropic and
// Responses `event: error` with their JSON; a Responses event carries
// seq, the sequence_number after the stream's last event (0 when it had
// none), which the SDKs' ResponseErrorEvent requires (issue 50 item 4).
func streamErrorEvent(a API, msg string, seq int64) []byte {
	switch a {
	case APIAnthropic:
		return append(append([]byte("event: error\ndata: "), errorBody(a, errUpstream, msg)...), "\n\n"...)
	case APIResponses:
		b, _ := json.Marshal(struct {
			Type     string  `json:"type"`
			Code     string  `json:"code"`
			Message  string  `json:"message"`
			Param    *string `json:"param"`
			Sequence int64   `json:"sequence_number"`
		}{"error", "upstream_error", msg, nil, seq})
		return append(append([]byte("event: error\ndata: "), b...), "\n\n"...)
	}
	return append(append([]byte("data: "), errorBody(a, errUpstream, msg)...), "\n\n"...)
}

// maxEchoed bounds the bytes of a client's value that an error message
// quotes back (a model name of a megabyte is not sent back whole).
const maxEchoed = 128

// quotedExcerpt is v quoted as %q quotes it, cut to its first max bytes
// (at a rune boundary) with the length it had when longer.
func quotedExcerpt(v string, max int) string {
	if len(v) <= max {
		return strconv.Quote(v)
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(v[cut]) {
		cut--
	}
	return strconv.Quote(v[:cut]) + fmt.Sprintf("... (%d bytes)", len(v))
}

// jsonString returns s as a JSON string literal.
func jsonString(s string) string {
	b, _ := json.Marshal(s) // a string cannot fail to marshal
	return string(b)
}
