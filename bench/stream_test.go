package bench

import (
	"errors"
	"github.com/lm-warden/warden/metrics/vllm"
	"math"
	"strings"
	"testing"
	"time"
)

func TestReadStream(t *testing.T) {
	openaiOK := "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
		": a comment\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\" the\"}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\" end\"}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n" +
		"data: [DONE]\n\n"
	anthropicOK := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":40,\"output_tokens\":1}}}\n\n" +
		"event: ping\ndata: {\"type\":\"ping\"}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" the\"}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" end\"}}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":3}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	for _, tc := range []struct {
		name    string
		api     API
		in      string
		text    string
		tokens  int
		cached  int
		wantErr string
	}{
		{"openai", OpenAI, openaiOK, " the end", 2, 32, ""},
		{"openai no usage", OpenAI, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n", "a", 1, -1, ""},
		{"openai truncated", OpenAI, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", "a", 1, -1, "ended before [DONE]"},
		{"openai error event", OpenAI, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\"}}\n\n", "a", 1, -1, "server_error: boom"},
		{"openai malformed", OpenAI, "data: {nope\n\n", "", 0, -1, "malformed event"},
		{"anthropic", Anthropic, anthropicOK, " the end", 3, -1, ""},
		{"anthropic error", Anthropic, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}\n\n", "", 0, -1, "overloaded_error: busy"},
		{"anthropic truncated", Anthropic, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n", "", 0, -1, "ended before message_stop"},
		{"empty", OpenAI, "", "", 0, -1, "ended before"},
		// Every line ending the SSE standard allows (CR, CRLF, LF, mixed).
		{"openai CR", OpenAI, strings.ReplaceAll(openaiOK, "\n", "\r"), " the end", 2, 32, ""},
		{"openai CRLF", OpenAI, strings.ReplaceAll(openaiOK, "\n", "\r\n"), " the end", 2, 32, ""},
		{"openai LF then CRLF", OpenAI, strings.ReplaceAll(openaiOK, "\n\n", "\n\r\n"), " the end", 2, 32, ""},
		{"anthropic CR", Anthropic, strings.ReplaceAll(anthropicOK, "\n", "\r"), " the end", 3, -1, ""},
		{"anthropic CRLF then CR", Anthropic, strings.ReplaceAll(anthropicOK, "\n\n", "\r\n\r"), " the end", 3, -1, ""},
		{"overlong event", OpenAI, "data: \"" + strings.Repeat("x", maxEventBytes) + "\"\n\ndata: [DONE]\n\n", "", 0, -1, "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sent := time.Unix(100, 0)
			now := func() time.Time { return sent.Add(250 * time.Millisecond) }
			o, err := readStream(strings.NewReader(tc.in), tc.api, sent, now)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
			if err != nil && !errors.Is(err, ErrStream) {
				t.Errorf("err %v does not wrap ErrStream", err)
			}
			if o.Text != tc.text || o.Tokens != tc.tokens || o.CachedTokens != tc.cached {
				t.Errorf("text %q tokens %d cached %d, want %q %d %d", o.Text, o.Tokens, o.CachedTokens, tc.text, tc.tokens, tc.cached)
			}
			if wantTTFB := 250 * time.Millisecond; tc.text != "" && o.TTFB != wantTTFB {
				t.Errorf("TTFB %v, want %v (the first non-empty delta)", o.TTFB, wantTTFB)
			}
		})
	}
}

func FuzzReadStream(f *testing.F) {
	f.Add("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n", false)
	f.Add("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"x\"}}\n\nevent: message_stop\ndata: {}\n\n", true)
	f.Add("data: {\"error\":{\"message\":\"x\"}}\n\n", false)
	f.Add("data: a\ndata: b\n\n:\n\nevent:\n", true)
	f.Fuzz(func(t *testing.T, in string, anthropic bool) {
		api := OpenAI
		if anthropic {
			api = Anthropic
		}
		o, err := readStream(strings.NewReader(in), api, time.Unix(0, 0), func() time.Time { return time.Unix(1, 0) })
		if err == nil && !o.Done {
			t.Fatal("no error, yet the stream did not end properly")
		}
		if o.Deltas > 0 && o.TTFB != time.Second {
			t.Fatalf("deltas %d but TTFB %v", o.Deltas, o.TTFB)
		}
	})
}

func TestParseMetrics(t *testing.T) {
	page := `# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 300
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 50
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 150
# TYPE vllm:prefix_cache_hits_created gauge
vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="1",model_name="m"} 2
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="1",finished_reason="stop",model_name="m"} 3
vllm:request_success_total{engine="1",finished_reason="length",model_name="m"} 4
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 1
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 1
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 1
`
	samples, err := ParseMetrics(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range samples {
		if strings.HasSuffix(s.Name, "_created") {
			t.Errorf("kept %s", s.Name)
		}
	}
	es, err := vllm.Parse(strings.NewReader(page), maxMetricsBytes)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 2 || es[0].PrefixQueries != 100 || es[1].PrefixHits != 150 || es[1].Requests != 7 || es[1].Running != 2 {
		t.Fatalf("engines %+v", es)
	}
	f := farm{engines: es}
	if f.busy() != 1 {
		t.Errorf("busy %d, want 1", f.busy())
	}
	zero := []vllm.Engine{{}, {}}
	if got := hitPct(zero, es); got != 50 {
		t.Errorf("hit %% %v, want 200/400 = 50", got)
	}
	if got := hitPct(zero, es[:1]); !math.IsNaN(got) {
		t.Errorf("hit %% over farms of different sizes %v, want NaN", got)
	}
	if _, err := ParseMetrics(strings.NewReader("vllm:x{engine=\"0\" 1\n")); err == nil {
		t.Error("a malformed page parsed")
	}
}

func FuzzParseMetrics(f *testing.F) {
	f.Add("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 1\n")
	f.Add("warden_later_turns_total{model=\"m\"} 3\nwarden_requests_total{model=\"m\",replica=\"x\",reason=\"sticky\"} 1\n")
	f.Add("x 1\n# HELP y\n")
	f.Fuzz(func(t *testing.T, page string) {
		samples, err := ParseMetrics(strings.NewReader(page))
		if err != nil {
			return
		}
		_ = proxyFigures(samples, "m")
	})
}
