package jsonscan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestScanBody(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Body
		wantErr string
	}{
		{`{"model":"m","stream":true,"user":"u","prompt_cache_key":"k","metadata":{"user_id":"x"},"messages":[{"a":[1,2.5e-3,-0,true,false,null]}]}`,
			Body{Model: "m", Stream: true, User: "u", PromptCacheKey: "k", Metadata: &Metadata{"x"}}, ""},
		{` {"model" : "a\"b\u00e9\n" } `, Body{Model: "a\"bé\n"}, ""},
		{`{"Model":"case matters"}`, Body{}, ""},
		// Raw non-ASCII, in the first 16 bytes of a string, past them, in a key.
		{`{"model":"é"}`, Body{Model: "é"}, ""},
		{`{"model":"` + strings.Repeat("a", 50) + `é"}`, Body{Model: strings.Repeat("a", 50) + "é"}, ""},
		{`{"model":"` + strings.Repeat("a", 20) + `é` + strings.Repeat("b", 70) + `"}`, Body{Model: strings.Repeat("a", 20) + "é" + strings.Repeat("b", 70)}, ""},
		{`{"ké":1}`, Body{}, ""},
		{`{"model":"a","model":"b"}`, Body{}, `duplicate key "model"`},
		// Keys match after unescaping, exactly, as Python's json does.
		{`{"mod\u0065l":"a"}`, Body{Model: "a"}, ""},
		{`{"\u006d\u006f\u0064\u0065\u006c":"a","stre\u0061m":true}`, Body{Model: "a", Stream: true}, ""},
		{`{"model":"a","mod\u0065l":"b"}`, Body{}, `duplicate key "model"`},
		{`{"mod\u0065l":"a","model":"b"}`, Body{}, `duplicate key "model"`},
		{`{"user":"a","us\u0065r":"b"}`, Body{}, `duplicate key "user"`},
		{`{"prompt_cache_key":"a","prompt\u005fcache_key":"b"}`, Body{}, `duplicate key "prompt_cache_key"`},
		{`{"metadata":null,"m\u0065tadata":{"user_id":"b"}}`, Body{}, `duplicate key "metadata"`},
		{`{"stream":false,"stream":true}`, Body{}, `duplicate key "stream"`},
		{`{"messages":[],"messages":[]}`, Body{}, `duplicate key "messages"`},
		{`{"metadata":{"user_id":"a","user\u005fid":"b"}}`, Body{}, `duplicate key "metadata.user_id"`},
		{`{"metadata":{"User_Id":"a","user_idx":"b"}}`, Body{Metadata: &Metadata{}}, ""},
		{`{"metadata":{"x":1,"x":2,"user_id":"a"}}`, Body{Metadata: &Metadata{"a"}}, ""},
		{`{"metadata":"u"}`, Body{}, "field metadata: want an object, got a JSON string"},
		{`{"x":1,"x":2,"\u0078":3}`, Body{}, ""},
		{`{"model\u0000":"a","MODEL":"b","model ":"c"}`, Body{}, ""},
		{`{"mod\u0065l":"a",}`, Body{}, "malformed JSON"},
		{`{"model":"a","model":7,}`, Body{}, "malformed JSON"}, // syntax first
		{`{"mod\u00G5l":"a"}`, Body{}, "invalid \\u escape"},
		{`{}`, Body{}, ""},
		{`{"model":`, Body{}, "malformed JSON at byte 9"},
		{`{"model":"m"`, Body{}, "malformed JSON"},
		{`{"model":"m"}x`, Body{}, "after the top-level object"},
		{`["model"]`, Body{}, "want a JSON object"},
		{`{"a":01}`, Body{}, "want ',' or '}'"},
		{`{"a":"\x"}`, Body{}, "invalid escape"},
		{"{\"a\":\"tab\there\"}", Body{}, "control character"},
		{`{"a":[1,]}`, Body{}, "unexpected character"},
		{`{"model":7}`, Body{}, "field model: want a string, got a JSON number"},
		{`{"metadata":{"user_id":1}}`, Body{}, "field metadata.user_id: want a string"},
		{strings.Repeat("[", 20000), Body{}, "want a JSON object"},
		{`{"a":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`, Body{}, "nested too deeply"},
	} {
		got, err := Scan([]byte(tc.in))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Scan(%.40q) err = %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		got.fallback = tc.want.fallback
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Scan(%.40q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

// TestScanEscapeRuns holds the dense-escape path (escapeRun) to
// encoding/json's reading of the model, and its faults to the byte they
// are at, with each case shifted by 0 to 63 bytes so that every escape
// and fault falls at every place in a word.
func TestScanEscapeRuns(t *testing.T) {
	const codeLine = `\tif err != nil {\n\t\treturn fmt.Errorf(\"step %d: %w\", n, err)\n\t}\n`
	for _, tc := range []struct {
		name string
		val  string // the model's JSON string, after `{"model":"` and the shift
		// wantAt is the fault's offset in val (-1: valid), want its words.
		wantAt int
		want   string
	}{
		{"code", `\tif err != nil {\n\t\treturn fmt.Errorf(\"step %d: %w\", n, err)\n\t}\n"}`, -1, ""},
		{"escaped backslashes and quotes", `\n\\\"\\\\\"\\"}`, -1, ""},
		{"flags that are not specials", `\n\"#\\]\n!"}`, -1, ""},
		{"unicode escapes in a run", `\n\u0041\t\u00e9\uD83D\uDE00\n"}`, -1, ""},
		{"a long clean stretch then more", `\n\n` + strings.Repeat("a", 45) + `\t\"` + strings.Repeat("b", 20) + `"}`, -1, ""},
		{"ends at a word's edge", `\n\n\n"}`, -1, ""},
		{"control character in a run", "\\n\\tab\x01c\"}", 6, "control character in a string"},
		{"control character after a clean stretch", `\n` + strings.Repeat("a", 30) + "\n\"}", 32, "control character in a string"},
		{"invalid escape in a run", `\n\t\n\q"}`, 7, "invalid escape"},
		{"invalid unicode escape in a run", `\n\t\u00zz"}`, 5, "invalid \\u escape"},
		{"short unicode escape at the end", `\n\n\u00`, 5, "short \\u escape"},
		{"backslash at the end", `\n\n\n\n\n\n\`, 13, "unterminated escape"},
		{"unterminated in a run", `\n\n\n\n\n\n\n\n\n`, 18, "unterminated string"},
		// Long runs, their ends and faults far in.
		{"code over blocks", strings.Repeat(codeLine, 5) + `"}`, -1, ""},
		{"backslash runs over blocks", `\n` + strings.Repeat(`\\`, 40) + `\"` + strings.Repeat(`\\`, 33) + `\\"}`, -1, ""},
		{"unicode escapes over blocks", strings.Repeat(`\u00e9\n`, 30) + `"}`, -1, ""},
		{"a quote escaped over blocks", strings.Repeat(`\"`, 70) + `"}`, -1, ""},
		{"control character past a block", strings.Repeat(codeLine, 3) + "\x1f" + codeLine + `"}`, 3 * len(codeLine), "control character in a string"},
		{"invalid escape past a block", strings.Repeat(codeLine, 3) + `\v` + codeLine + `"}`, 3*len(codeLine) + 1, "invalid escape"},
		{"unterminated past a block", strings.Repeat(codeLine, 3), 3 * len(codeLine), "unterminated string"},
	} {
		for shift := range 64 {
			in := `{"model":"` + strings.Repeat("x", shift) + tc.val
			got, err := Scan([]byte(in))
			if tc.wantAt < 0 {
				var want struct{ Model string }
				if jerr := json.Unmarshal([]byte(in), &want); jerr != nil {
					t.Fatalf("%s: the case is not valid JSON: %v", tc.name, jerr)
				}
				if err != nil || got.Model != want.Model {
					t.Errorf("%s, shift %d: model %q, %v; want %q", tc.name, shift, got.Model, err, want.Model)
				}
				continue
			}
			if json.Valid([]byte(in)) {
				t.Fatalf("%s: the case is valid JSON", tc.name)
			}
			want := fmt.Sprintf("malformed JSON at byte %d: %s", len(`{"model":"`)+shift+tc.wantAt, tc.want)
			if err == nil || err.Error() != want {
				t.Errorf("%s, shift %d: err %v, want %q", tc.name, shift, err, want)
			}
		}
	}
}

// FuzzScanBody checks Scan against encoding/json: the same inputs are
// valid JSON objects; a duplicate key is one that encoding/json decodes to
// the same name twice, and only for the keys the proxy reads; without one,
// the same fields come out of the same (exactly matched, unescaped) keys.
func FuzzScanBody(f *testing.F) {
	for _, s := range []string{`{"model":"m","stream":true}`, `{"a":[1,{"b":null}],"user":"\u0041"}`, `{"x":1e+5,"y":-0.5}`,
		`{"metadata":{"user_id":"q"},"metadata":null}`, `{"a":"` + strings.Repeat("xy\\n", 9) + `"}`,
		// Dense escapes, as in code (escapeRun), with a \u and a clean stretch.
		`{"model":"\tif x {\n\t\treturn \"\u00e9\\\"` + strings.Repeat("a", 40) + `\n\t}\n"}`,
		// Escaped keys: each decodes to a key the proxy reads.
		`{"model":"a","mod\u0065l":"b"}`, `{"\u006dodel":"a"}`, `{"us\u0065r":"a","user":"b"}`,
		`{"prompt\u005fcache_key":"k"}`, `{"metadata":{"user\u005fid":"a","user_id":"b"}}`,
		`{"m\u0065tadata":{"user_id":"a"}}`, `{"str\u0065am":true,"stream":false}`, `{"Model":"a","\u004dodel":"b"}`,
		`{"\u017ftream":true}`, `{"mod\u0065l\u0000":"a"}`, `{"m\u0065ssages":[],"input":"x","inp\u0075t":"y"}`,
		// Strings long enough for the block path (strBlocks).
		`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat(`\tif err != nil {\n\t\treturn \"\u00e9\\\"\n\t}\n`, 5) + `"}]}`,
		`{"prompt":"` + strings.Repeat(`\\`, 40) + `\\\"` + strings.Repeat("z", 70) + `\u00e9"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := Scan(data)
		// The block path and the word-at-a-time one agree, to the byte
		// of a fault.
		for _, blocks := range []bool{true, false} {
			if b, e := scanWith(data, blocks); errString(e) != errString(err) || !reflect.DeepEqual(b, got) {
				t.Fatalf("blocks %v: %+v, %v; Scan %+v, %v", blocks, b, e, got, err)
			}
		}
		var se *syntaxError
		syntaxOK := !errors.As(err, &se)
		trimmed := bytes.TrimLeft(data, " \t\r\n")
		stdOK := json.Valid(data) && len(trimmed) > 0 && trimmed[0] == '{'
		if syntaxOK != stdOK {
			t.Fatalf("Scan syntax verdict %v (err %v), encoding/json %v", syntaxOK, err, stdOK)
		}
		if !stdOK {
			return
		}
		keys := objectKeys(t, data)
		dup := ""
		seen := map[string]bool{}
		for _, k := range keys {
			if keyIndex(k) >= 0 && seen[k] && dup == "" {
				dup = k
			}
			seen[k] = true
		}
		if dup != "" {
			if err == nil || !strings.Contains(err.Error(), "duplicate key") {
				t.Fatalf("key %q given twice, Scan err %v, want a duplicate-key error", dup, err)
			}
			return
		}
		if err != nil && strings.Contains(err.Error(), `duplicate key "`) && !strings.Contains(err.Error(), "metadata.user_id") {
			t.Fatalf("Scan found a duplicate (%v) in keys %q", err, keys)
		}
		var top map[string]json.RawMessage
		if stdErr := json.Unmarshal(data, &top); stdErr != nil {
			t.Fatalf("Scan accepted what encoding/json rejects: %v", stdErr)
		}
		var want Body
		var wantErr error
		for name, raw := range top {
			k := keyIndex(name)
			var dst any
			switch k {
			case -1:
				continue
			case keyModel:
				dst = &want.Model
			case keyStream:
				dst = &want.Stream
			case KeyPromptCacheKey:
				dst = &want.PromptCacheKey
			case keyUser:
				dst = &want.User
			case keyMetadata:
				if string(raw) == "null" {
					continue
				}
				var m map[string]json.RawMessage
				if e := json.Unmarshal(raw, &m); e != nil {
					wantErr = e
					continue
				}
				want.Metadata = &Metadata{}
				n := 0
				for _, k := range objectKeys(t, raw) {
					if k == "user_id" {
						n++
					}
				}
				if n > 1 {
					wantErr = errors.New("duplicate metadata.user_id")
				}
				if u, ok := m["user_id"]; ok {
					if e := json.Unmarshal(u, &want.Metadata.UserID); e != nil {
						wantErr = e
					}
				}
				continue
			default:
				want.fallback[k-KeySystem] = raw
				continue
			}
			if e := json.Unmarshal(raw, dst); e != nil {
				wantErr = e
			}
		}
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("Scan err %v, encoding/json err %v", err, wantErr)
		}
		if err != nil {
			return
		}
		for i := range got.fallback {
			if !bytes.Equal(got.fallback[i], want.fallback[i]) {
				t.Fatalf("raw %s = %q, encoding/json %q", readKeyNames[KeySystem+i], got.fallback[i], want.fallback[i])
			}
		}
		got.fallback, want.fallback = [len(got.fallback)][]byte{}, [len(want.fallback)][]byte{}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("fields %+v, encoding/json %+v", got, want)
		}
	})
}

// objectKeys returns the top-level keys of a valid JSON object as
// encoding/json decodes them (unescaped), duplicates included, in order.
func objectKeys(t *testing.T, data []byte) []string {
	d := json.NewDecoder(bytes.NewReader(data))
	if _, err := d.Token(); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for d.More() {
		k, err := d.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k.(string))
		var skip json.RawMessage
		if err := d.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

func BenchmarkScanBody(b *testing.B) {
	data := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("some prompt text, ", 14000) + `"}],"stream":true}`)
	// A coding agent's prompt: source code and tool output, a newline
	// every line and quotes, all escaped, in many messages.
	var code strings.Builder
	code.WriteString(`{"model":"m","messages":[`)
	for i := range 200 {
		if i > 0 {
			code.WriteByte(',')
		}
		code.WriteString(`{"role":"user","content":[{"type":"text","text":"`)
		code.WriteString(strings.Repeat(`\tif err := run(\"step\", n); err != nil {\n\t\treturn fmt.Errorf(\"step %d: %w\", n, err)\n\t}\n`, 16))
		code.WriteString(`"}]}`)
	}
	code.WriteString(`],"stream":true}`)
	for _, tc := range []struct {
		name string
		data []byte
	}{{"Scan", data}, {"Scan-code", []byte(code.String())}} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(tc.data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Scan(tc.data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	// The UTF-8 check before the scan: an ASCII body, one with a
	// multi-byte character every 4 KB or so (tool output's ✓ and box
	// lines) and one with one every 18 bytes.
	sparse := []byte(strings.ReplaceAll(string(data), strings.Repeat("some prompt text, ", 200), strings.Repeat("some prompt text, ", 199)+"søme prompt text, "))
	dense := []byte(strings.ReplaceAll(string(data), "some prompt", "søme prompt"))
	for _, tc := range []struct {
		name  string
		data  []byte
		check func([]byte) bool
	}{{"ValidUTF8", data, ValidUTF8}, {"utf8.Valid", data, utf8.Valid}, {"ValidUTF8-sparse", sparse, ValidUTF8},
		{"utf8.Valid-sparse", sparse, utf8.Valid}, {"ValidUTF8-dense", dense, ValidUTF8}, {"utf8.Valid-dense", dense, utf8.Valid}} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(tc.data)))
			for b.Loop() {
				if !tc.check(tc.data) {
					b.Fatal("invalid")
				}
			}
		})
	}
	b.Run("encoding-json", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		b.ReportAllocs()
		for b.Loop() {
			var v Body
			if err := json.Unmarshal(data, &v); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// FuzzMemberValue: MemberValue finds what encoding/json finds under the
// key at the top level, and nothing in what it refuses.
func FuzzMemberValue(f *testing.F) {
	for _, s := range []string{`{"usage":{"a":1}}`, `{"us\u0061ge":1,"usage":2}`, `{"x":{"usage":1}}`, `{"usage":[1,2]} `,
		`{"usage":"\"}"}`, `{"Usage":1}`, `[1]`, `{"usage":1`, `{"usage":1}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, ok := MemberValue(data, "usage")
		var m map[string]json.RawMessage
		stdErr := json.Unmarshal(data, &m)
		trimmed := bytes.TrimLeft(data, " \t\r\n")
		isObject := len(trimmed) > 0 && trimmed[0] == '{'
		if stdErr != nil || !isObject {
			if ok {
				t.Fatalf("MemberValue found %q in what encoding/json refuses (%v)", got, stdErr)
			}
			return
		}
		want, has := m["usage"]
		if ok != has || !bytes.Equal(got, want) {
			t.Fatalf("MemberValue = %q, %v; encoding/json %q, %v", got, ok, want, has)
		}
	})
}

// TestUnmarshalFieldAsJSON holds unmarshalField's shortcuts (a string
// without escapes, true, false) to encoding/json, and each value that
// must not take them (escapes, invalid UTF-8, null, another kind).
func TestUnmarshalFieldAsJSON(t *testing.T) {
	for _, raw := range []string{`"claude-sonnet"`, `""`, `"é ü"`, `"a\"b"`, `"\u00e9"`, `"\\"`,
		"\"\xff\"", "\"a\xc3\"", `null`, `true`, `false`, `1`, `[]`, `{}`, `"x"`} {
		t.Run(raw, func(t *testing.T) {
			var got, want string
			gotErr, wantErr := unmarshalField("f", []byte(raw), &got), json.Unmarshal([]byte(raw), &want)
			if got != want || (gotErr == nil) != (wantErr == nil) {
				t.Errorf("string: got %q, %v; encoding/json %q, %v", got, gotErr, want, wantErr)
			}
			var gotB, wantB bool
			gotErr, wantErr = unmarshalField("f", []byte(raw), &gotB), json.Unmarshal([]byte(raw), &wantB)
			if gotB != wantB || (gotErr == nil) != (wantErr == nil) {
				t.Errorf("bool: got %v, %v; encoding/json %v, %v", gotB, gotErr, wantB, wantErr)
			}
		})
	}
}
