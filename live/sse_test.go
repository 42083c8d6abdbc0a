package live

import (
	"math"
	"testing"
)

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
		// vLLM sends these only with the first output (see streamWatch).
		{"openai role chunk", APIOpenAI, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n", true, false, false, Usage{-1, -1, -1}},
		{"anthropic message_start", APIAnthropic, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n", true, false, false, Usage{-1, -1, -1}},
		{"anthropic ping", APIAnthropic, "event: ping\ndata: {\"type\":\"ping\"}\n\n", false, false, false, Usage{-1, -1, -1}},
		{"responses opened", APIResponses, "event: response.created\ndata: {}\n\nevent: response.in_progress\ndata: {}\n\n", false, false, false, Usage{-1, -1, -1}},
		{"responses output item", APIResponses, "event: response.created\ndata: {}\n\nevent: response.output_item.added\ndata: {}\n\n", true, false, false, Usage{-1, -1, -1}},
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

func FuzzStreamWatch(f *testing.F) {
	f.Add("event: a\ndata: 1\n\ndata: [DONE]\n\n", uint8(3))
	f.Add("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"usage\":{\"prompt_tokens\":1}}\r\n\r\n", uint8(1))
	f.Add("event: message_start\ndata: {\"message\":{\"usage\":{\"input_tokens\":1}}}\n\n", uint8(40))
	f.Fuzz(func(t *testing.T, stream string, cut uint8) {
		// What the watch sees must not depend on how the stream is chunked.
		for _, api := range []API{APIOpenAI, APIAnthropic, APIResponses} {
			watch := func(chunk int) *streamWatch {
				w := newStreamWatch(api, nil)
				for i := 0; i < len(stream); i += chunk {
					w.Write([]byte(stream[i:min(i+chunk, len(stream))]))
				}
				return w
			}
			a, b := watch(len(stream)+1), watch(int(cut)%16+1)
			if a.firstToken != b.firstToken || a.terminal != b.terminal || a.upstreamErr != b.upstreamErr || a.usage != b.usage {
				t.Fatalf("%s: chunking changed what the watch saw: %+v vs %+v", api, a, b)
			}
		}
	})
}

func TestSequenceNumber(t *testing.T) {
	for _, tc := range []struct {
		data string
		want int64
		ok   bool
	}{
		{`{"type":"response.created","sequence_number":0,"response":{}}`, 0, true},
		{`{"sequence_number": 41 ,"type":"x"}`, 41, true},
		{`{"type":"x","delta":"\"sequence_number\":9"}`, 0, false}, // inside a string: escaped quotes
		{`{"type":"x"}`, 0, false},
		{`{"sequence_number":"7"}`, 0, false},
		{`{"sequence_number":99999999999999999999}`, 0, false},
		{`{"sequence_number"`, 0, false},
	} {
		n, ok := sequenceNumber([]byte(tc.data))
		if n != tc.want || ok != tc.ok {
			t.Errorf("sequenceNumber(%s) = %d, %v; want %d, %v", tc.data, n, ok, tc.want, tc.ok)
		}
	}
}

func FuzzSequenceNumber(f *testing.F) {
	f.Add(`{"sequence_number":12}`)
	f.Add(`{"sequence_number" :  9223372036854775807}`)
	f.Fuzz(func(t *testing.T, data string) {
		n, ok := sequenceNumber([]byte(data))
		if ok && (n < 0 || n == math.MaxInt64) {
			t.Fatalf("sequenceNumber(%q) = %d: want a non-negative number below MaxInt64", data, n)
		}
	})
}

func TestBodyUsage(t *testing.T) {
	for _, tc := range []struct {
		name string
		api  API
		in   string
		want Usage
	}{
		{"openai", APIOpenAI, `{"id":"x","choices":[{"message":{"content":"ok"}}],"usage":{"prompt_tokens":16,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8}}}`,
			Usage{16, 2, 8}},
		{"anthropic adds the cache reads", APIAnthropic, `{"type":"message","usage":{"input_tokens":3,"output_tokens":5,"cache_read_input_tokens":100}}`,
			Usage{103, 5, 100}},
		{"responses", APIResponses, `{"object":"response","usage":{"input_tokens":7,"output_tokens":1,"input_tokens_details":{"cached_tokens":4}}}`,
			Usage{7, 1, 4}},
		{"escaped key", APIOpenAI, `{"us\u0061ge":{"prompt_tokens":1,"completion_tokens":1}}`, Usage{1, 1, -1}},
		{"the last of two, as encoding/json", APIOpenAI, `{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":9,"completion_tokens":2}}`, Usage{9, 2, -1}},
		{"nested usage is not the answer's", APIOpenAI, `{"choices":[{"usage":{"prompt_tokens":5}}]}`, unknownUsage()},
		{"case matters", APIOpenAI, `{"Usage":{"prompt_tokens":5}}`, unknownUsage()},
		{"null", APIOpenAI, `{"usage":null}`, unknownUsage()},
		{"none", APIOpenAI, `{"id":"x"}`, unknownUsage()},
		{"wrong type", APIOpenAI, `{"usage":{"prompt_tokens":"5"}}`, unknownUsage()},
		{"malformed", APIOpenAI, `{"usage":{"prompt_tokens":5}`, unknownUsage()},
		{"trailing data", APIOpenAI, `{"usage":{"prompt_tokens":5}} x`, unknownUsage()},
		{"not an object", APIOpenAI, `[{"usage":{"prompt_tokens":5}}]`, unknownUsage()},
	} {
		if got := bodyUsage(tc.api, []byte(tc.in)); got != tc.want {
			t.Errorf("%s: bodyUsage = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
