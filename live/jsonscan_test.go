package live

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestScanBody(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    body
		wantErr string
	}{
		{`{"model":"m","stream":true,"user":"u","prompt_cache_key":"k","metadata":{"user_id":"x"},"messages":[{"a":[1,2.5e-3,-0,true,false,null]}]}`,
			body{Model: "m", Stream: true, User: "u", PromptCacheKey: "k", Metadata: &struct {
				UserID string `json:"user_id"`
			}{"x"}}, ""},
		{` {"model" : "a\"b\u00e9\n" } `, body{Model: "a\"bé\n"}, ""},
		{`{"Model":"case matters"}`, body{}, ""},
		{`{"model":"a","model":"b"}`, body{Model: "b"}, ""},
		{`{}`, body{}, ""},
		{`{"model":`, body{}, "malformed JSON at byte 9"},
		{`{"model":"m"`, body{}, "malformed JSON"},
		{`{"model":"m"}x`, body{}, "after the top-level object"},
		{`["model"]`, body{}, "want a JSON object"},
		{`{"a":01}`, body{}, "want ',' or '}'"},
		{`{"a":"\x"}`, body{}, "invalid escape"},
		{"{\"a\":\"tab\there\"}", body{}, "control character"},
		{`{"a":[1,]}`, body{}, "unexpected character"},
		{`{"model":7}`, body{}, "field model: want a string, got a JSON number"},
		{`{"metadata":{"user_id":1}}`, body{}, "field metadata.user_id: want a string"},
		{strings.Repeat("[", 20000), body{}, "want a JSON object"},
		{`{"a":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`, body{}, "nested too deeply"},
	} {
		got, err := scanBody([]byte(tc.in))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("scanBody(%.40q) err = %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("scanBody(%.40q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

// FuzzScanBody checks scanBody against encoding/json: the same inputs are
// valid JSON objects, and the same fields come out.
func FuzzScanBody(f *testing.F) {
	for _, s := range []string{`{"model":"m","stream":true}`, `{"a":[1,{"b":null}],"user":"\u0041"}`, `{"x":1e+5,"y":-0.5}`, `{"metadata":{"user_id":"q"},"metadata":null}`, `{"a":"` + strings.Repeat("xy\\n", 9) + `"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := scanBody(data)
		var se *syntaxError
		syntaxOK := !errors.As(err, &se)
		trimmed := bytes.TrimLeft(data, " \t\r\n")
		stdOK := json.Valid(data) && len(trimmed) > 0 && trimmed[0] == '{'
		if syntaxOK != stdOK {
			t.Fatalf("scanBody syntax verdict %v (err %v), encoding/json %v", syntaxOK, err, stdOK)
		}
		if !stdOK || err != nil {
			return
		}
		ascii := true
		for _, c := range data {
			if c >= 0x80 || (c >= 'A' && c <= 'Z') {
				ascii = false // encoding/json folds key case
			}
		}
		var want body
		if stdErr := json.Unmarshal(data, &want); stdErr != nil {
			t.Fatalf("scanBody accepted what encoding/json rejects: %v", stdErr)
		}
		if ascii && !reflect.DeepEqual(got, want) {
			t.Fatalf("fields %+v, encoding/json %+v", got, want)
		}
	})
}

func BenchmarkScanBody(b *testing.B) {
	data := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("some prompt text, ", 14000) + `"}],"stream":true}`)
	b.Run("scanBody", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := scanBody(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		b.ReportAllocs()
		for b.Loop() {
			var v body
			if err := json.Unmarshal(data, &v); err != nil {
				b.Fatal(err)
			}
		}
	})
}
