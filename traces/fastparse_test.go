package traces

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
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
	// The same, with 24 bytes or more after each number (read eight
	// bytes at a time).
	{`{"hash_ids":[18446744073709551615,18446744073709551615,0,1,22,333,4444,55555,666666,7777777,88888888]}`, true},
	{`{"hash_ids":[18446744073709551616,                                     1]}`, false},
	{`{"hash_ids":[18446744073709551620,                                     1]}`, false},
	{`{"hash_ids":[99999999999999999999,                                     1]}`, false},
	{`{"hash_ids":[100000000000000000000,                                    1]}`, false},
	{`{"hash_ids":[123456789012345678901234,                                 1]}`, false},
	{`{"hash_ids":[9999999999999999999,10000000000000000000,                 1]}`, true},
	{`{"hash_ids":[12345678,123456789012345678,1234567890123456,12345678901234567890,1234567,123456789,7,                 1]}`, true},
	{`{"hash_ids":[1234567812345678x,                                       1]}`, false},
	{`{"hash_ids":[0123456789012345,                                        1]}`, false},
	{`{"hash_ids":[00,                                                      1]}`, false},
	{`{"hash_ids":[0 , 1 ,2, 3e5,                                           1]}`, false},
	{`{"hash_ids":[0 , 1 ,2, 3.5,                                           1]}`, false},
	{`{"hash_ids":[0 , 1 ,2, 3 ,                                            1] }`, true},
	{`{"hash_ids":[0 , 1 ,2, 3 ,                                            1,] }`, false},
	{`{"hash_ids":[0 , 1 ,2, 3 ,` + "\xc3\xa9" + `                                     1] }`, false},
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
		got := parseFast([]byte(c.line), &fast, nil)
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
		if !parseFast(line, &fast, nil) {
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

// TestParseEight checks the eight-digit arithmetic and the digit count
// against strconv.
func TestParseEight(t *testing.T) {
	for _, s := range []string{"00000000", "12345678", "99999999", "10000000", "00000001", "90817263"} {
		x := binary.LittleEndian.Uint64([]byte(s))
		want, _ := strconv.ParseUint(s, 10, 64)
		if leadingDigits(x) != 8 || parseEight(x) != want {
			t.Errorf("%s: leadingDigits %d, parseEight %d", s, leadingDigits(x), parseEight(x))
		}
	}
	for _, c := range []struct {
		s string
		n int
	}{
		{"1234567/", 7}, {"1234567:", 7}, {"a2345678", 0}, {" 2345678", 0}, {"1234\x005678", 4},
		{"\xff2345678"[:8], 0}, {"12,45678", 2}, {"1]}     ", 1}, {"9\xb0\xb9\x2f\x3a\x00\xff\x80", 1},
		{"0000000\x2f", 7}, {"000000\x3a0", 6}, {"\x2f0000000", 0},
	} {
		x := binary.LittleEndian.Uint64([]byte(c.s))
		if got := leadingDigits(x); got != c.n {
			t.Errorf("%q: leadingDigits %d, want %d", c.s, got, c.n)
		}
		if c.n < 8 {
			want, _ := strconv.ParseUint("0"+c.s[:c.n], 10, 64)
			if got := parseEight(x << (64 - 8*c.n)); got != want {
				t.Errorf("%q: the first %d digits read %d, want %d", c.s, c.n, got, want)
			}
		}
	}
	// Random words, mostly digits, against a byte-by-byte count.
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1 << 16 {
		var b [8]byte
		for i := range b {
			b[i] = byte('0' + rng.IntN(10))
			if rng.IntN(4) == 0 {
				b[i] = byte(rng.IntN(256))
			}
		}
		want := 0
		for want < 8 && b[want] >= '0' && b[want] <= '9' {
			want++
		}
		if got := leadingDigits(binary.LittleEndian.Uint64(b[:])); got != want {
			t.Fatalf("%q: leadingDigits %d, want %d", b, got, want)
		}
	}
}

// memoLines are lines read one after the other with one idMemo: arrays that
// share prefixes of their text (up to the middle of an id, with and
// without white space), differ after them, turn invalid after them, are
// a prefix of the one before or extend it, and first ids that share a
// memo slot.
func memoLines() []string {
	ids := func(xs ...string) string {
		return `{"t_ms":1,"session":"s","prompt_tokens":1,"hash_ids":[` + strings.Join(xs, ",") + `],"output_hash_ids":[` + strings.Join(xs[:len(xs)/2], ",") + `]}`
	}
	base := []string{"11", "22", "333", "4444", "55555", "666666", "7777777", "88888888", "999999999", "18446744073709551615", "12345678901234567890", "5"}
	with := func(i int, v string) []string {
		xs := append([]string(nil), base...)
		xs[i] = v
		return xs
	}
	return []string{
		ids(base...),
		ids(base...),                            // the same line
		ids(with(5, "666667")...),               // differs inside an id
		ids(with(5, "6666661")...),              // one digit more
		ids(with(5, "66666")...),                // one digit less
		ids(with(9, "18446744073709551616")...), // overflow after the shared ids
		ids(with(7, "088888888")...),            // a leading zero after them
		ids(with(7, "8.5")...),                  // a fraction
		ids(base[:9]...),                        // a prefix of the line before
		ids(append(base, "13", "14")...),        // longer
		`{"t_ms":1,"session":"s","prompt_tokens":1,"hash_ids":[11 , 22,333 ,4444,55555,666666,7777777,88888888,999999999]}`,
		ids(with(0, "27")...), // first id 27 = 11 mod 16: the slot changes hands
		ids(base...),
		ids(with(11, "")...), // an empty last element: bad syntax
		ids(base...),
	}
}

// TestParseFastMemo reads memoLines with one memo and checks every line
// against encoding/json and against parseFast without a memo.
func TestParseFastMemo(t *testing.T) {
	memo := new(idMemo)
	for _, l := range memoLines() {
		prev := Request{HashIDs: make([]uint64, 3, 8)}
		withMemo, without, ref := freshRequest(&prev), freshRequest(&Request{}), freshRequest(&Request{})
		got, want := parseFast([]byte(l), &withMemo, memo), parseFast([]byte(l), &without, nil)
		if got != want {
			t.Errorf("%s: parseFast %v with the memo, %v without", l, got, want)
		}
		if got && (!jsonParse([]byte(l), &ref) || !reflect.DeepEqual(withMemo, ref)) {
			t.Errorf("%s: parseFast with the memo gives %+v, encoding/json %+v", l, withMemo, ref)
		}
	}
}

// FuzzParseFastMemo checks the second of two lines read with one memo
// against encoding/json.
func FuzzParseFastMemo(f *testing.F) {
	ls := memoLines()
	for i := 1; i < len(ls); i++ {
		f.Add([]byte(ls[i-1]), []byte(ls[i]))
	}
	f.Fuzz(func(t *testing.T, first, second []byte) {
		memo := new(idMemo)
		var a Request
		parseFast(first, &a, memo)
		fast, ref := freshRequest(&Request{}), freshRequest(&Request{})
		if !parseFast(second, &fast, memo) {
			return
		}
		if !jsonParse(second, &ref) {
			t.Fatalf("parseFast accepted %q after %q, encoding/json rejects it", second, first)
		}
		if !reflect.DeepEqual(fast, ref) {
			t.Fatalf("%q after %q: parseFast %+v, encoding/json %+v", second, first, fast, ref)
		}
	})
}
