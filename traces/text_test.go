package traces

import (
	"slices"
	"strings"
	"testing"
)

func TestTextTokens(t *testing.T) {
	for _, tc := range []struct {
		n, want int
	}{{0, 1}, {1, 1}, {4, 1}, {5, 2}, {64, 16}, {65, 17}} {
		if got := TextTokens(make([]byte, tc.n)); got != tc.want {
			t.Errorf("TextTokens(%d bytes) = %d, want %d", tc.n, got, tc.want)
		}
	}
}

func TestTextBlockIDs(t *testing.T) {
	key := []byte("k")
	text := []byte(strings.Repeat("abcdefgh", 40)) // 320 bytes, 80 tokens, 5 full blocks
	ids := TextBlockIDs(key, text, 90)             // 90 tokens: 6 ids, the last partial
	if len(ids) != 6 {
		t.Fatalf("%d ids for 90 tokens, want 6", len(ids))
	}
	longer := TextBlockIDs(key, append(slices.Clone(text), "more text"...), 96)
	if !slices.Equal(ids[:5], longer[:5]) {
		t.Error("a longer text changed the ids of the common full blocks")
	}
	if ids[5] == longer[5] {
		t.Error("a partial block has the id of a full one")
	}
	if TextBlockIDs([]byte("other"), text, 90)[0] == ids[0] {
		t.Error("the key does not change the ids")
	}
	changed := slices.Clone(text)
	changed[70] = 'X' // inside block 1
	ch := TextBlockIDs(key, changed, 90)
	if ch[0] != ids[0] || ch[1] == ids[1] || ch[2] == ids[2] {
		t.Error("ids do not chain: a change in block 1 must change blocks 1.. and only those")
	}
	if n := len(TextBlockIDs(key, nil, 0)); n != 0 {
		t.Errorf("%d ids for 0 tokens", n)
	}
}

func TestPromptText(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    Dialect
		body string
		want string
	}{
		{"chat", DialectOpenAI, `{"messages":[{"role":"system","content":"S"},{"role":"user","content":"U"}]}`, "\x00system\x00S\x00user\x00U"},
		{"chat blocks", DialectOpenAI, `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`, "\x00user\x00a\x00b"},
		{"completions", DialectOpenAI, `{"prompt":"P"}`, "P"},
		{"anthropic", DialectAnthropic, `{"system":[{"type":"text","text":"x-anthropic-billing-header: cch=9"},{"type":"text","text":"S"}],"messages":[{"role":"user","content":[{"type":"text","text":"U"}]},{"role":"assistant","content":"A"}]}`, "S\x00user\x00U\x00assistant\x00A"},
		{"responses string", DialectResponses, `{"instructions":"I","input":"U"}`, "I\x00user\x00U"},
		{"responses list", DialectResponses, `{"input":[{"role":"user","content":"U"}]}`, "\x00user\x00U"},
		{"not JSON", DialectOpenAI, `{`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(PromptText([]byte(tc.body), tc.d)); got != tc.want {
				t.Errorf("PromptText = %q, want %q", got, tc.want)
			}
		})
	}
	// Prefix stability: appending a message appends its MessageText.
	one := PromptText([]byte(`{"messages":[{"role":"user","content":"U"}]}`), DialectOpenAI)
	two := PromptText([]byte(`{"messages":[{"role":"user","content":"U"},{"role":"assistant","content":"A"}]}`), DialectOpenAI)
	if string(two) != string(one)+MessageText("assistant", "A") {
		t.Errorf("appending a message gave %q from %q", two, one)
	}
}

func FuzzPromptText(f *testing.F) {
	f.Add([]byte(`{"messages":[{"role":"user","content":"U"}]}`), uint8(0))
	f.Add([]byte(`{"system":[{"type":"text","text":"S"}],"messages":[]}`), uint8(2))
	f.Add([]byte(`{"input":"x","instructions":"y"}`), uint8(1))
	f.Add([]byte(`{"prompt":[1,2]}`), uint8(0))
	f.Fuzz(func(t *testing.T, body []byte, d uint8) {
		text := PromptText(body, Dialect(d%3))
		tokens := TextTokens(text)
		if ids := TextBlockIDs([]byte("k"), text, tokens); len(ids) != (tokens+TextBlockTokens-1)/TextBlockTokens {
			t.Fatalf("%d ids for %d tokens", len(ids), tokens)
		}
	})
}
