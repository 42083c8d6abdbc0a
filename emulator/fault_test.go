package emulator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestParseFaults(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Faults
		wantErr string // "" for success
	}{
		{"", Faults{}, ""},
		{"  ", Faults{}, ""},
		{"stall-after-headers=1", Faults{StallAfterHeaders: 1}, ""},
		{"stall-after-headers=0.25, error-503=0.5 ,slow-metrics=1.5s,die-mid-stream=0",
			Faults{StallAfterHeaders: 0.25, Error503: 0.5, SlowMetrics: 1500 * time.Millisecond}, ""},
		{"slow-metrics=0s", Faults{}, ""},
		{"error-503=1e-3", Faults{Error503: 0.001}, ""},
		{"stall=1", Faults{}, `item 1 "stall=1": unknown fault "stall"`},
		{"error-503=0.1,die-mid-stream=1.5", Faults{}, `item 2 "die-mid-stream=1.5": die-mid-stream wants a probability in [0, 1], got "1.5"`},
		{"error-503=-0.1", Faults{}, `item 1 "error-503=-0.1": error-503 wants a probability`},
		{"error-503=NaN", Faults{}, `item 1 "error-503=NaN": error-503 wants a probability`},
		{"error-503=half", Faults{}, `got "half"`},
		{"slow-metrics=3", Faults{}, `item 1 "slow-metrics=3": slow-metrics wants a duration >= 0 such as 2s, got "3"`},
		{"slow-metrics=-1s", Faults{}, `slow-metrics wants a duration >= 0`},
		{"error-503", Faults{}, `item 1 "error-503": want name=value`},
		{"error-503=", Faults{}, `item 1 "error-503=": want name=value`},
		{"error-503=1,,slow-metrics=1s", Faults{}, `item 2 "": want name=value`},
		{"error-503=1,error-503=0", Faults{}, `item 2 "error-503=0": error-503 given twice`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseFaults(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseFaults(%q) = %+v, %v; want an error containing %q", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseFaults(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
			back, err := ParseFaults(got.String())
			if err != nil || back != got {
				t.Errorf("String %q reads back as %+v, %v", got.String(), back, err)
			}
		})
	}
}

// FuzzParseFaults: any text is either faults whose String reads back the
// same, or an error naming an item; never a panic.
func FuzzParseFaults(f *testing.F) {
	for _, s := range []string{
		"", "stall-after-headers=1", "error-503=0.5,slow-metrics=2s", "die-mid-stream=0.01,stall-after-headers=0.2",
		"slow-metrics=1h2m3.5s", "error-503=1,error-503=1", "x=1", ",", "=", "error-503=1e-300", "slow-metrics=9223372036s",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseFaults(s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "item ") {
				t.Fatalf("error %q does not name the item", err)
			}
			return
		}
		for _, p := range []float64{got.StallAfterHeaders, got.Error503, got.DieMidStream} {
			if !(p >= 0 && p <= 1) {
				t.Fatalf("probability %g from %q", p, s)
			}
		}
		if got.SlowMetrics < 0 {
			t.Fatalf("slow-metrics %v from %q", got.SlowMetrics, s)
		}
		back, err := ParseFaults(got.String())
		if err != nil || back != got {
			t.Fatalf("%q: %+v prints %q, which reads back as %+v, %v", s, got, got.String(), back, err)
		}
	})
}

// TestFaults: each fault, on every inference API, against a real emulator
// on 127.0.0.1.
func TestFaults(t *testing.T) {
	user := strings.Repeat("Please read this file. ", 30)
	bodies := map[string]func(stream bool) map[string]any{
		"/v1/chat/completions": func(stream bool) map[string]any { return chatBody("sys", []string{user}, nil, 8, stream) },
		"/v1/messages":         func(stream bool) map[string]any { return anthropicBody("sys", []string{user}, nil, 8, stream) },
		"/v1/responses": func(stream bool) map[string]any {
			return map[string]any{"input": user, "max_output_tokens": 8, "stream": stream}
		},
		"/v1/completions": func(stream bool) map[string]any {
			return map[string]any{"prompt": user, "max_tokens": 8, "stream": stream}
		},
	}
	type result struct {
		status  int
		header  http.Header
		body    []byte
		readErr error
	}
	// send posts body and reads the answer; a stall is cut by the client
	// after wait, once the headers came.
	send := func(t *testing.T, base, path string, body map[string]any, wait time.Duration) result {
		t.Helper()
		b, _ := json.Marshal(body)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		res, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		defer res.Body.Close()
		if wait > 0 {
			time.AfterFunc(wait, cancel)
		}
		out, err := io.ReadAll(res.Body)
		return result{res.StatusCode, res.Header, out, err}
	}
	for _, tc := range []struct {
		name  string
		fault string
		wait  time.Duration // cut the client after this (stalls)
		check func(t *testing.T, path string, stream bool, r result)
	}{
		{"error-503", "error-503=1", 0, func(t *testing.T, path string, _ bool, r result) {
			if r.status != 503 || r.readErr != nil {
				t.Fatalf("%d %s %v, want 503", r.status, r.body, r.readErr)
			}
			if path == "/v1/messages" {
				if anthropicErr(t, r.body) != "overloaded_error" {
					t.Errorf("body %s, want an Anthropic overloaded_error", r.body)
				}
				return
			}
			var v struct {
				Error *struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    int     `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(r.body, &v); err != nil || v.Error == nil || v.Error.Type != "ServiceUnavailableError" || v.Error.Code != 503 || v.Error.Message == "" {
				t.Errorf("body %s, want vLLM's error shape {error: {message, type ServiceUnavailableError, param, code 503}}", r.body)
			}
		}},
		{"stall-after-headers", "stall-after-headers=1", 300 * time.Millisecond, func(t *testing.T, _ string, stream bool, r result) {
			if r.status != 200 || len(r.body) != 0 || !errors.Is(r.readErr, context.Canceled) {
				t.Fatalf("%d %q %v, want 200 headers and no byte until the client gave up", r.status, r.body, r.readErr)
			}
			if ct := r.header.Get("Content-Type"); stream != strings.HasPrefix(ct, "text/event-stream") {
				t.Errorf("Content-Type %q for stream=%v", ct, stream)
			}
		}},
		{"die-mid-stream", "die-mid-stream=1", 0, func(t *testing.T, path string, stream bool, r result) {
			if r.status != 200 || !errors.Is(r.readErr, io.ErrUnexpectedEOF) || len(r.body) == 0 {
				t.Fatalf("%d %q %v, want 200, some bytes, then the connection closed (unexpected EOF)", r.status, r.body, r.readErr)
			}
			if !stream {
				if json.Valid(r.body) {
					t.Errorf("a whole JSON answer %s", r.body)
				}
				return
			}
			if !strings.Contains(string(r.body), "data: ") {
				t.Errorf("no event before the close: %q", r.body)
			}
			for _, end := range []string{"[DONE]", "message_stop", "response.completed"} {
				if strings.Contains(string(r.body), end) {
					t.Errorf("the stream reached its end %s: %q", end, r.body)
				}
			}
		}},
		{"none (P=0)", "error-503=0,stall-after-headers=0,die-mid-stream=0", 0, func(t *testing.T, _ string, stream bool, r result) {
			if r.status != 200 || r.readErr != nil {
				t.Fatalf("%d %s %v, want a normal answer", r.status, r.body, r.readErr)
			}
			if !stream && !json.Valid(r.body) {
				t.Errorf("body %s", r.body)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			faults, err := ParseFaults(tc.fault)
			if err != nil {
				t.Fatal(err)
			}
			r := start(t, testFarm(t, 1, ""), Options{Faults: faults})
			for path, body := range bodies {
				for _, stream := range []bool{false, true} {
					res := send(t, r.urls[0], path, body(stream), tc.wait)
					t.Run(strings.TrimPrefix(path, "/v1/")+map[bool]string{true: "/stream", false: ""}[stream], func(t *testing.T) {
						tc.check(t, path, stream, res)
					})
				}
			}
			// /health stays OK and nothing is left running in the engine.
			res, err := http.Get(r.urls[0] + "/health")
			if err != nil || res.StatusCode != 200 {
				t.Fatalf("/health: %v %v", res, err)
			}
			res.Body.Close()
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				fams := scrape(t, r.urls[0])
				if value(fams, "vllm:num_requests_running")+value(fams, "vllm:num_requests_waiting") == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("requests still running in the engine")
				}
			}
		})
	}
}

func anthropicErr(t *testing.T, body []byte) string {
	t.Helper()
	var v struct {
		Type  string `json:"type"`
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &v) != nil || v.Type != "error" {
		return ""
	}
	return v.Error.Type
}

// TestSlowMetrics: slow-metrics=D delays /metrics by at least D; /health
// and inference are not delayed by it.
func TestSlowMetrics(t *testing.T) {
	const d = 400 * time.Millisecond
	r := start(t, testFarm(t, 1, ""), Options{Faults: Faults{SlowMetrics: d}})
	began := time.Now()
	fams := scrape(t, r.urls[0])
	if took := time.Since(began); took < d {
		t.Errorf("/metrics answered after %v, want at least %v", took, d)
	}
	if _, ok := fams["vllm:num_requests_running"]; !ok {
		t.Error("the delayed /metrics lacks vLLM's series")
	}
	// A client that gives up before D gets nothing, while /health answers.
	client := &http.Client{Timeout: d / 4}
	if res, err := client.Get(r.urls[0] + "/metrics"); err == nil {
		res.Body.Close()
		t.Errorf("/metrics answered within %v", d/4)
	}
	res, err := (&http.Client{Timeout: 10 * time.Second}).Get(r.urls[0] + "/health")
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("/health: %v %v", res, err)
	}
	res.Body.Close()
}

// TestFaultsDeterministic: the n-th request's fault depends on the seed
// only, and the share injected follows the probability.
func TestFaultsDeterministic(t *testing.T) {
	faults := Faults{Error503: 0.5}
	run := func(seed uint64) string {
		r := start(t, testFarm(t, 1, ""), Options{Seed: seed, Faults: faults})
		var sb strings.Builder
		for range 40 {
			status, _ := post(t, r.urls[0]+"/v1/chat/completions", chatBody("s", []string{"q"}, nil, 1, false))
			sb.WriteByte(map[int]byte{200: '.', 503: 'x'}[status])
		}
		return sb.String()
	}
	a, b, c := run(7), run(7), run(8)
	if a != b {
		t.Errorf("seed 7 gave %s then %s", a, b)
	}
	if a == c {
		t.Errorf("seeds 7 and 8 both gave %s", a)
	}
	if n := strings.Count(a, "x"); n < 10 || n > 30 {
		t.Errorf("%d of 40 answered 503 at P=0.5 (%s)", n, a)
	}
	if strings.Count(a, ".")+strings.Count(a, "x") != 40 {
		t.Errorf("unexpected statuses: %q", a)
	}
}
