package bench

import (
	"io"
	"strings"
	"testing"

	"github.com/lm-warden/warden/traces"
)

// TestPromptTextFollowsTheGenerator checks the text rule on every turn of a
// few sessions of the default workload: the canonical text (as
// traces.PromptText computes it from the request body bench sends) is
// exactly 4 bytes per token of the generator's prompt, and each turn extends
// the previous one; the system prompt is shared, first messages are not.
func TestPromptTextFollowsTheGenerator(t *testing.T) {
	for _, api := range []API{OpenAI, Anthropic} {
		t.Run(string(api), func(t *testing.T) {
			w := traces.DefaultWorkload()
			gen := traces.NewGenerator(w, 16, 3)
			var firsts []string
			var system string
			for range 3 {
				s, _ := gen.NextSession()
				c := NewConversation(s, w.SystemPromptTokens, 3, api)
				if system == "" {
					system = c.System()
				} else if c.System() != system {
					t.Fatal("sessions have different system prompts")
				}
				var prev []byte
				for k, turn := range s.Turns {
					msgs := c.Prompt(k)
					req, err := newRequest(t.Context(), &requestSpec{target: "http://x", api: api, model: "m"}, c, msgs, turn.OutputTokens)
					if err != nil {
						t.Fatal(err)
					}
					body, err := io.ReadAll(req.Body)
					if err != nil {
						t.Fatal(err)
					}
					d := traces.DialectOpenAI
					if api == Anthropic {
						d = traces.DialectAnthropic
					}
					text := traces.PromptText(body, d)
					if mine := CanonicalText(api, c.HasSystem(), c.System(), msgs); mine != string(text) {
						t.Fatalf("turn %d: CanonicalText differs from traces.PromptText", k)
					}
					if len(text) != BytesPerToken*turn.PromptTokens {
						t.Errorf("session %s turn %d: %d bytes of canonical text, want 4 x %d", s.ID, k, len(text), turn.PromptTokens)
					}
					if !strings.HasPrefix(string(text), string(prev)) {
						t.Errorf("session %s turn %d does not extend the previous prompt", s.ID, k)
					}
					c.Answer(strings.Repeat(" ans", turn.OutputTokens)) // 4 bytes per token, as the emulator answers
					prev = append(text, traces.MessageText("assistant", c.msgs[len(c.msgs)-1].Content)...)
				}
				firsts = append(firsts, c.msgs[0].Content)
			}
			if firsts[0] == firsts[1] || firsts[1][:64] == firsts[2][:64] {
				t.Error("first messages are not each session's own")
			}
		})
	}
}

func TestSegmentText(t *testing.T) {
	for _, n := range []int{0, 1, 3, 4, 5, 64, 1001} {
		s := segmentText(42, n)
		if len(s) != n {
			t.Errorf("segmentText(42, %d) has %d bytes", n, len(s))
		}
		if strings.ContainsAny(s, "\"\\\x00\n") {
			t.Errorf("segmentText(42, %d) has a byte JSON or the canonical text must escape", n)
		}
	}
	if segmentText(1, 400) == segmentText(2, 400) {
		t.Error("two keys give the same text")
	}
	if segmentText(1, 400) != segmentText(1, 400) {
		t.Error("one key gives two texts")
	}
}

func TestSessionUUID(t *testing.T) {
	a, b := SessionUUID(1, "s000001"), SessionUUID(1, "s000001")
	if a != b || a == SessionUUID(2, "s000001") || a == SessionUUID(1, "s000002") {
		t.Errorf("UUIDs %s %s: want equal for one seed and session, different otherwise", a, b)
	}
	if len(a) != 36 || a[14] != '4' {
		t.Errorf("UUID %s: want the version-4 shape", a)
	}
}

// CanonicalText is the request's canonical text (see the package's prompt
// rule) of messages sent with a system prompt (hasSystem) of text system.
func CanonicalText(api API, hasSystem bool, system string, msgs []Message) string {
	var b strings.Builder
	if hasSystem {
		if api == OpenAI {
			b.WriteString(markerSystem)
		}
		b.WriteString(system)
	}
	for _, m := range msgs {
		b.WriteString("\x00" + m.Role + "\x00")
		b.WriteString(m.Content)
	}
	return b.String()
}
