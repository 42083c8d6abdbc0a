package traces

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"reflect"
	"strconv"
	"testing"
)

// jsonParse decodes a request line as Reader did before parseFast, with
// encoding/json: the reference parseFast must agree with.
func jsonParse(line []byte, r *Request) bool {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	return dec.Decode(r) == nil && !trailing(dec, line)
}

func freshRequest(old *Request) Request {
	return Request{CachedTokens: -1, Replica: -1, HashIDs: old.HashIDs[:0], OutputHashIDs: old.OutputHashIDs[:0]}
}

// fastParseCases are lines parseFast must accept (true) or hand to
// encoding/json (false).
var fastParseCases = []struct {
	line string
	fast bool
}{
	{`{"t_ms":0,"session":"m0000000","turn":0,"prompt_tokens":2170,"output_tokens":277,"cached_tokens":-1,"replica":-1,"think_ms":0,"hash_ids":[4433337198117490103,18446744073709551615,0]}`, true},
	{` { "t_ms" : 5 , "session" : "s é" , "parent":"p", "model":"m", "hash_ids" : [ 1 , 2 ] , "output_hash_ids":[] } `, true},
	{`{}`, true},
	{`{"hash_ids":[],"hash_ids":[7]}`, true},
	{`{"t_ms":-0,"turn":9223372036854775807}`, true},
	{`{"T_MS":1}`, false},                           // case-insensitive match: encoding/json's
	{`{"t_ms":1.0}`, false},                         // a float
	{`{"t_ms":1e3}`, false},                         //
	{`{"t_ms":01}`, false},                          // invalid JSON
	{`{"t_ms":null}`, false},                        //
	{`{"session":"a\"b"}`, false},                   // an escape
	{`{"session":"a` + "\x01" + `"}`, false},        // a control character
	{`{"session":"` + "\xff" + `"}`, false},         // invalid UTF-8 (encoding/json replaces it)
	{`{"hash_ids":[18446744073709551616]}`, false},  // overflow
	{`{"hash_ids":[18446744073709551620]}`, false},  //
	{`{"hash_ids":[99999999999999999999]}`, false},  //
	{`{"hash_ids":[100000000000000000000]}`, false}, //
	{`{"hash_ids":[9999999999999999999,10000000000000000000]}`, true},
	{`{"hash_ids":[12345678,123456789012345678,1234567890123456,12345678901234567890,7]}`, true},
	{`{"hash_ids":[1234567812345678x]}`, false},
	{`{"hash_ids":[0123456789012345]}`, false},
	{`{"hash_ids":[-1]}`, false},            //
	{`{"turn":9223372036854775808}`, false}, //
	{`{"t_ms":1}x`, false},                  // trailing data
	{`{"t_ms":1,}`, false},                  //
	{`{"extra":1}`, false},                  // unknown key
	{`{"t_ms":1`, false},                    //
}

func TestParseFastAgreesWithEncodingJSON(t *testing.T) {
	prev := Request{HashIDs: make([]uint64, 3, 8)}
	for _, c := range fastParseCases {
		fast, ref := freshRequest(&prev), freshRequest(&Request{HashIDs: make([]uint64, 3, 8)})
		got := parseFast([]byte(c.line), &fast)
		if got != c.fast {
			t.Errorf("%s: parseFast %v, want %v", c.line, got, c.fast)
		}
		if got && (!jsonParse([]byte(c.line), &ref) || !reflect.DeepEqual(fast, ref)) {
			t.Errorf("%s: parseFast gives %+v, encoding/json %+v", c.line, fast, ref)
		}
	}
}

// FuzzParseFast checks that whatever parseFast accepts, encoding/json
// accepts too, with the same result.
func FuzzParseFast(f *testing.F) {
	for _, c := range fastParseCases {
		f.Add([]byte(c.line))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		prev := Request{HashIDs: []uint64{1, 2}}
		fast, ref := freshRequest(&prev), freshRequest(&Request{HashIDs: []uint64{3}})
		if !parseFast(line, &fast) {
			return
		}
		if !jsonParse(line, &ref) {
			t.Fatalf("parseFast accepted %q, encoding/json rejects it", line)
		}
		if !reflect.DeepEqual(fast, ref) {
			t.Fatalf("%q: parseFast %+v, encoding/json %+v", line, fast, ref)
		}
	})
}

// BenchmarkReadTrace reads 2,000 requests of 144 hash ids each.
func BenchmarkReadTrace(b *testing.B) {
	var buf bytes.Buffer
	w := NewWriter(&buf, Header{Format: Format, Version: Version, BlockSize: 16})
	ids := make([]uint64, 144)
	for i := range ids {
		ids[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	for i := range 2000 {
		if err := w.Write(&Request{ArrivalMs: int64(i), Session: "s", PromptTokens: 144 * 16, CachedTokens: -1, Replica: -1, HashIDs: ids}); err != nil {
			b.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(buf.Len()))
	b.ReportAllocs()
	for b.Loop() {
		rd, err := NewReader(bytes.NewReader(buf.Bytes()), "bench", ReaderOptions{})
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for {
			if _, err := rd.Next(); err != nil {
				break
			}
			n++
		}
		if n != 2000 {
			b.Fatalf("%d requests", n)
		}
	}
}

// TestParseEight checks the eight-digit arithmetic against strconv.
func TestParseEight(t *testing.T) {
	for _, s := range []string{"00000000", "12345678", "99999999", "10000000", "00000001", "90817263"} {
		x := binary.LittleEndian.Uint64([]byte(s))
		want, _ := strconv.ParseUint(s, 10, 64)
		if !eightDigits(x) || parseEight(x) != want {
			t.Errorf("%s: eightDigits %v, parseEight %d", s, eightDigits(x), parseEight(x))
		}
	}
	for _, s := range []string{"1234567/", "1234567:", "a2345678", " 2345678", "1234\x005678", "\xff2345678"[:8]} {
		if eightDigits(binary.LittleEndian.Uint64([]byte(s))) {
			t.Errorf("%q: taken for eight digits", s)
		}
	}
}
