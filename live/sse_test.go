package live

import (
	"strings"
	"testing"
)

func TestSSEReaderSplitsEvents(t *testing.T) {
	stream := "event: a\ndata: 1\ndata: 2\n\n: comment\n\r\ndata:x\r\n\r\nevent: b\rdata: y\r\r"
	want := []string{"a|1\n2", "|x", "b|y"}
	// Every way of cutting the stream into two chunks gives the same events.
	for cut := 0; cut <= len(stream); cut++ {
		var got []string
		r := sseReader{onEvent: func(e, d []byte) { got = append(got, string(e)+"|"+string(d)) }}
		r.Write([]byte(stream[:cut]))
		r.Write([]byte(stream[cut:]))
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("cut %d: events %q, want %q", cut, got, want)
		}
		if r.mid {
			t.Fatalf("cut %d: reader thinks it is mid-event at a boundary", cut)
		}
	}
}

func TestStreamWatch(t *testing.T) {
	for _, tc := range []struct {
		name     string
		api      API
		stream   string
		first    bool
		terminal bool
		upErr    bool
		usage    Usage
	}{
		{"openai", APIOpenAI,
			"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
				"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n" +
				"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":7,\"prompt_tokens_details\":{\"cached_tokens\":64}}}\n\n" +
				"data: [DONE]\n\n",
			true, true, false, Usage{100, 7, 64}},
		{"openai cut short", APIOpenAI, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n", true, false, false, Usage{-1, -1, -1}},
		{"openai error event", APIOpenAI, "data: {\"error\":{\"message\":\"x\"}}\n\n", false, false, true, Usage{-1, -1, -1}},
		{"anthropic", APIAnthropic,
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"cache_read_input_tokens\":90,\"output_tokens\":1}}}\n\n" +
				"event: content_block_delta\ndata: {\"delta\":{\"text\":\"a\"}}\n\n" +
				"event: message_delta\ndata: {\"usage\":{\"output_tokens\":12}}\n\n" +
				"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
			true, true, false, Usage{100, 12, 90}},
		{"responses", APIResponses,
			"event: response.output_text.delta\ndata: {\"delta\":\"a\"}\n\n" +
				"event: response.completed\ndata: {\"response\":{\"usage\":{\"input_tokens\":50,\"output_tokens\":5,\"input_tokens_details\":{\"cached_tokens\":32}}}}\n\n",
			true, true, false, Usage{50, 5, 32}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			firsts := 0
			w := newStreamWatch(tc.api, func() { firsts++ })
			for i := 0; i < len(tc.stream); i += 7 { // odd chunks
				w.Write([]byte(tc.stream[i:min(i+7, len(tc.stream))]))
			}
			if w.firstToken != tc.first || (tc.first && firsts != 1) || w.terminal != tc.terminal || w.upstreamErr != tc.upErr || w.usage != tc.usage {
				t.Errorf("first %v (%d calls) terminal %v upstreamErr %v usage %+v; want %v %v %v %+v",
					w.firstToken, firsts, w.terminal, w.upstreamErr, w.usage, tc.first, tc.terminal, tc.upErr, tc.usage)
			}
		})
	}
}

func TestLastEventEnd(t *testing.T) {
	for in, want := range map[string]int{"": 0, "data: a\n": 0, "data: a\n\n": 9, "data: a\n\ndata: b": 9, "a\r\n\r\nb": 5, "a\r\rb\n\nc": 6} {
		if got := lastEventEnd([]byte(in)); got != want {
			t.Errorf("lastEventEnd(%q) = %d, want %d", in, got, want)
		}
	}
}

func FuzzSSEReader(f *testing.F) {
	f.Add("event: a\ndata: 1\n\ndata: [DONE]\n\n", uint8(3))
	f.Add("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"usage\":{\"prompt_tokens\":1}}\r\n\r\n", uint8(1))
	f.Add("event: message_start\ndata: {\"message\":{\"usage\":{\"input_tokens\":1}}}\n\n", uint8(40))
	f.Fuzz(func(t *testing.T, stream string, cut uint8) {
		// The events must not depend on how the stream is chunked.
		collect := func(chunk int) []string {
			var got []string
			r := sseReader{onEvent: func(e, d []byte) { got = append(got, string(e)+"\x00"+string(d)) }}
			for i := 0; i < len(stream); i += chunk {
				r.Write([]byte(stream[i:min(i+chunk, len(stream))]))
			}
			return got
		}
		whole, parts := collect(len(stream)+1), collect(int(cut)%16+1)
		if strings.Join(whole, "\x01") != strings.Join(parts, "\x01") {
			t.Fatalf("chunking changed the events: %q vs %q", whole, parts)
		}
		for _, api := range []API{APIOpenAI, APIAnthropic, APIResponses} {
			w := newStreamWatch(api, nil)
			w.Write([]byte(stream))
		}
	})
}
