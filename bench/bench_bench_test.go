package bench

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/traces"
)

// BenchmarkRequestBody builds and encodes the sixth turn of a default
// session (about 13k tokens, 52 KB of JSON): the client's cost per request.
func BenchmarkRequestBody(b *testing.B) {
	w := traces.DefaultWorkload()
	s, _ := traces.NewGenerator(w, 16, 1).NextSession()
	spec := &requestSpec{target: "http://x", api: OpenAI, model: "m"}
	b.ReportAllocs()
	for b.Loop() {
		c := NewConversation(s, w.SystemPromptTokens, 1, OpenAI)
		var msgs []Message
		for k := range s.Turns {
			msgs = c.Prompt(k)
			c.Answer(strings.Repeat(" ans", s.Turns[k].OutputTokens))
		}
		req, err := newRequest(b.Context(), spec, c, msgs, 256)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, req.Body)
	}
}

// BenchmarkReadStream reads a 256-token OpenAI stream.
func BenchmarkReadStream(b *testing.B) {
	var sb strings.Builder
	for range 256 {
		sb.WriteString("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" ans\"}}]}\n\n")
	}
	sb.WriteString("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":13000,\"completion_tokens\":256}}\n\ndata: [DONE]\n\n")
	stream := sb.String()
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := readStream(strings.NewReader(stream), OpenAI, time.Time{}, time.Now); err != nil {
			b.Fatal(err)
		}
	}
}
