package live

import (
	"errors"
	"net/http"
	"strings"
	"testing"
)

func TestExtract(t *testing.T) {
	const billingA = `[{"type":"text","text":"x-anthropic-billing-header: cc_version=1; cch=aaaa"},{"type":"text","text":"You are Claude Code."}]`
	const billingB = `[{"type":"text","text":"x-anthropic-billing-header: cc_version=1; cch=bbbb"},{"type":"text","text":"You are Claude Code."}]`
	for _, tc := range []struct {
		name        string
		api         API
		hdr         map[string]string
		body        string
		wantSession string // "" with wantHashOf: compare with another body's fallback
		wantParent  string
		wantSource  string
	}{
		{"claude code header wins", APIAnthropic, map[string]string{"X-Claude-Code-Session-Id": "cc-1", "session-id": "codex"},
			`{"model":"m","metadata":{"user_id":"user_x_account_y_session_z"}}`, "cc-1", "", SourceClaudeCode},
		{"codex header", APIOpenAI, map[string]string{"session-id": "codex-1", "x-session-id": "oc"}, `{"model":"m","user":"u"}`, "codex-1", "", SourceCodex},
		{"opencode header", APIOpenAI, map[string]string{"x-session-id": "oc-1"}, `{"model":"m","prompt_cache_key":"k"}`, "oc-1", "", SourceOpenCode},
		{"dynamo header wins", APIOpenAI, map[string]string{"X-Dynamo-Session-ID": "dyn-1", "X-Claude-Code-Session-Id": "cc"}, `{"model":"m"}`, "dyn-1", "", SourceDynamo},
		{"dynamo parent", APIOpenAI, map[string]string{"x-dynamo-session-id": "child", "x-dynamo-parent-session-id": "root"}, `{"model":"m"}`, "child", "root", SourceDynamo},
		{"opencode affinity header", APIOpenAI, map[string]string{"x-session-affinity": "ses_1"}, `{"model":"m","prompt_cache_key":"k"}`, "ses_1", "", SourceAffinity},
		{"opencode own providers", APIOpenAI, map[string]string{"x-opencode-session": "ses_2"}, `{"model":"m"}`, "ses_2", "", SourceOpenCodeZen},
		{"opencode subagent", APIOpenAI, map[string]string{"x-session-affinity": "ses_c", "X-Session-Id": "ses_c", "x-parent-session-id": "ses_p"}, `{"model":"m"}`, "ses_c", "ses_p", SourceOpenCode},
		{"codex subagent", APIResponses, map[string]string{"session-id": "th-c", "x-codex-parent-thread-id": "th-p"}, `{"model":"m"}`, "th-c", "th-p", SourceCodex},
		{"parent equal to session is no parent", APIOpenAI, map[string]string{"session-id": "th", "x-codex-parent-thread-id": "th"}, `{"model":"m"}`, "th", "", SourceCodex},
		{"parent without a session id is ignored", APIOpenAI, map[string]string{"x-parent-session-id": "p"}, `{"model":"m","user":"u"}`, "u", "", SourceUser},
		{"metadata json form", APIAnthropic, nil,
			`{"model":"m","metadata":{"user_id":"{\"device_id\":\"d\",\"account_uuid\":\"a\",\"session_id\":\"sess-json\"}"}}`, "sess-json", "", SourceMetadataUserID},
		{"metadata old form", APIAnthropic, nil,
			`{"model":"m","metadata":{"user_id":"user_abc123_account_11111111-2222_session_33333333-4444"}}`, "33333333-4444", "", SourceMetadataUserID},
		{"metadata plain", APIAnthropic, nil, `{"model":"m","metadata":{"user_id":"someone"}}`, "someone", "", SourceMetadataUserID},
		{"prompt_cache_key before user", APIOpenAI, nil, `{"model":"m","prompt_cache_key":"pck","user":"u"}`, "pck", "", SourcePromptCacheKey},
		{"user", APIOpenAI, nil, `{"model":"m","user":"u-1"}`, "u-1", "", SourceUser},
		{"subagent", APIAnthropic, map[string]string{"X-Claude-Code-Session-Id": "root", "x-claude-code-agent-id": "ag-7", "x-claude-code-parent-agent-id": "ag-1"},
			`{"model":"m"}`, "root\x00agent\x00ag-7", "root", SourceClaudeCode},
		{"subagent without session", APIAnthropic, map[string]string{"x-claude-code-agent-id": "ag-7", "x-claude-code-parent-agent-id": "ag-1"},
			`{"model":"m"}`, "ag-1\x00agent\x00ag-7", "ag-1", headerParentAgentID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := extract(t, tc.api, tc.hdr, tc.body)
			if id.Session != tc.wantSession || id.Parent != tc.wantParent || id.Source != tc.wantSource {
				t.Errorf("got %+q, want session %q parent %q source %q", id, tc.wantSession, tc.wantParent, tc.wantSource)
			}
		})
	}

	t.Run("fallback is stable across turns and skips the billing block", func(t *testing.T) {
		turn1 := `{"model":"m","system":` + billingA + `,"messages":[{"role":"user","content":"fix the bug"}]}`
		turn2 := `{"model":"m","system":` + billingB + `,"messages":[{"role":"user","content":[{"type":"text","text":"fix the bug"}]},{"role":"assistant","content":"done"},{"role":"user","content":"thanks"}]}`
		other := `{"model":"m","system":` + billingA + `,"messages":[{"role":"user","content":"write docs"}]}`
		a, b, c := extract(t, APIAnthropic, nil, turn1), extract(t, APIAnthropic, nil, turn2), extract(t, APIAnthropic, nil, other)
		if a.Source != SourcePromptHash || a.Session != b.Session {
			t.Errorf("turns of one conversation: %q vs %q (source %s), want equal prompt hashes", a.Session, b.Session, a.Source)
		}
		if a.Session == c.Session {
			t.Errorf("two conversations share the fallback id %q", a.Session)
		}
	})
	t.Run("fallback openai and responses", func(t *testing.T) {
		chat1 := `{"model":"m","messages":[{"role":"system","content":"sys"},{"role":"user","content":"hi"}]}`
		chat2 := `{"model":"m","messages":[{"role":"system","content":"sys"},{"role":"user","content":"hi"},{"role":"assistant","content":"yo"},{"role":"user","content":"more"}]}`
		if a, b := extract(t, APIOpenAI, nil, chat1), extract(t, APIOpenAI, nil, chat2); a.Session != b.Session {
			t.Errorf("chat turns differ: %q %q", a.Session, b.Session)
		}
		r1 := `{"model":"m","instructions":"sys","input":"hi"}`
		r2 := `{"model":"m","instructions":"sys","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]},{"role":"assistant","content":"yo"}]}`
		if a, b := extract(t, APIResponses, nil, r1), extract(t, APIResponses, nil, r2); a.Session != b.Session {
			t.Errorf("responses turns differ: %q %q", a.Session, b.Session)
		}
	})
	t.Run("no system prompt and no user message: no session", func(t *testing.T) {
		for _, tc := range []struct {
			api  API
			body string
		}{
			{APIOpenAI, `{"model":"m"}`},
			{APIOpenAI, `{"model":"m","messages":[]}`},
			{APIOpenAI, `{"model":"m","messages":[{"role":"assistant","content":"an answer"}]}`},
			{APIOpenAI, `{"model":"m","prompt":""}`},
			{APIAnthropic, `{"model":"m","max_tokens":1,"messages":[]}`},
			{APIAnthropic, `{"model":"m","system":[{"type":"text","text":"x-anthropic-billing-header: cch=1"}]}`},
			{APIResponses, `{"model":"m","input":[{"role":"assistant","content":"an answer"}]}`},
			{APIResponses, `{"model":"m","input":""}`},
		} {
			if id := extract(t, tc.api, nil, tc.body); id != (Identity{Source: SourceNone}) {
				t.Errorf("%s %s: identity %+q, want none (no session)", tc.api, tc.body, id)
			}
		}
		// Either one alone still makes a session.
		for _, tc := range []struct {
			api  API
			body string
		}{
			{APIOpenAI, `{"model":"m","messages":[{"role":"system","content":"sys"}]}`},
			{APIOpenAI, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`},
			{APIAnthropic, `{"model":"m","system":"sys","messages":[]}`},
			{APIResponses, `{"model":"m","instructions":"sys"}`},
			{APIOpenAI, `{"model":"m","prompt":"once upon"}`},
		} {
			if id := extract(t, tc.api, nil, tc.body); id.Source != SourcePromptHash || id.Session == "" {
				t.Errorf("%s %s: identity %+q, want a prompt hash", tc.api, tc.body, id)
			}
		}
	})
	t.Run("fallback reads exact keys, as the backend does", func(t *testing.T) {
		// "SYSTEM" is not Anthropic's system (encoding/json would fold it);
		// an escaped key is the key itself.
		a := extract(t, APIAnthropic, nil, `{"model":"m","SYSTEM":"other","messages":[{"role":"user","content":"hi"}]}`)
		b := extract(t, APIAnthropic, nil, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
		c := extract(t, APIAnthropic, nil, `{"model":"m","m\u0065ssages":[{"role":"user","content":"hi"}]}`)
		if a.Session != b.Session || b.Session != c.Session || a.Source != SourcePromptHash {
			t.Errorf("sessions %q %q %q, want one prompt hash", a.Session, b.Session, c.Session)
		}
	})
	t.Run("too long", func(t *testing.T) {
		for _, hdr := range []map[string]string{
			{"session-id": strings.Repeat("a", 300)},
			{"X-Claude-Code-Session-Id": "s", "x-claude-code-agent-id": strings.Repeat("a", 300)},
		} {
			b, _ := decodeBody([]byte(`{"model":"m"}`))
			_, err := extractFrom(header(hdr), &b, APIOpenAI, 256)
			if !errors.Is(err, ErrSessionTooLong) {
				t.Errorf("headers %v: err = %v, want ErrSessionTooLong", len(hdr), err)
			}
		}
	})
}

func header(m map[string]string) http.Header {
	h := http.Header{}
	for k, v := range m {
		h.Set(k, v)
	}
	return h
}

func extract(t *testing.T, api API, hdr map[string]string, body string) Identity {
	t.Helper()
	b, err := decodeBody([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	id, err := extractFrom(header(hdr), &b, api, 256)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestKeyer(t *testing.T) {
	k1, k2 := NewKeyer([]byte("a")), NewKeyer([]byte("b"))
	if k1.Sum("s") != k1.Sum("s") || k1.Sum("s") == k2.Sum("s") || k1.Sum("s") == k1.Sum("t") {
		t.Error("keyed hashes must be stable per key and differ across keys and ids")
	}
	if got := k1.Sum("s"); len(got) != 32 || strings.Contains(got, "s") && got == "s" {
		t.Errorf("Sum = %q, want 32 hex digits", got)
	}
	if k1.Sum("") != "" {
		t.Error(`Sum("") must be ""`)
	}
}

func FuzzExtract(f *testing.F) {
	f.Add(`{"model":"m","metadata":{"user_id":"user_a_account_b_session_c"}}`, "", uint8(2))
	f.Add(`{"model":"m","system":[{"type":"text","text":"x-anthropic-billing-header: cch=1"}],"messages":[{"role":"user","content":"hi"}]}`, "", uint8(2))
	f.Add(`{"model":"m","messages":[{"role":"user","content":[{"type":"image"}]}]}`, "sess", uint8(0))
	f.Add(`{"model":"m","input":[{"role":"user","content":"x"}]}`, "", uint8(1))
	f.Add(`{"model":"m","prompt":["a","b"]}`, "", uint8(0))
	f.Add(`{"model":"m","messages":[{"role":"assistant","content":"x"}]}`, "", uint8(0))
	f.Add(`{"model":"m","prompt":""}`, "", uint8(0))
	f.Add(`{"mod\u0065l":"m","m\u0065ssages":[{"role":"user","content":"x"}],"us\u0065r":"u"}`, "", uint8(0))
	f.Add(`{"model":"m","metadata":{"user\u005fid":"user_a_account_b_session_c"}}`, "", uint8(2))
	f.Fuzz(func(t *testing.T, body, sessionHeader string, api uint8) {
		b, err := decodeBody([]byte(body))
		if err != nil {
			return
		}
		h := http.Header{}
		if sessionHeader != "" {
			h.Set("x-session-id", sessionHeader)
			if api&4 != 0 { // a subagent of another agent (OpenCode's parent header)
				h.Set("x-parent-session-id", "p"+sessionHeader)
			}
		}
		id, err := extractFrom(h, &b, API(api%3), 256)
		if err != nil {
			if !errors.Is(err, ErrSessionTooLong) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if id.Source == "" || (id.Session == "") != (id.Source == SourceNone) || id.Source == SourceNone && id.Parent != "" {
			t.Fatalf("identity %+v: want a session and its source, or SourceNone alone", id)
		}
		if id.Source != SourcePromptHash && len(id.Session) > 256 && id.Parent == "" {
			t.Fatalf("over-long session accepted: %d bytes", len(id.Session))
		}
	})
}
