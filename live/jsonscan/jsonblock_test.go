package jsonscan

import (
	"bytes"
	"math/bits"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestEscaped holds escaped to a byte-by-byte walk of the backslashes:
// the escaped bytes that are not backslashes.
func TestEscaped(t *testing.T) {
	walk := func(b uint64) (esc uint64, last bool) {
		for i := 0; i < 64; i++ {
			if b&(1<<i) == 0 {
				continue
			}
			if i == 63 {
				return esc, true
			}
			if b&(1<<(i+1)) == 0 {
				esc |= 1 << (i + 1)
			}
			i++ // the escaped byte, whatever it is
		}
		return esc, false
	}
	r := rand.New(rand.NewPCG(3, 4))
	masks := []uint64{0, ^uint64(0), 1, 1 << 63, 3 << 62, 7 << 61, evenBits, evenBits << 1}
	for range 100000 {
		// Dense and sparse backslashes, runs of every length.
		m := r.Uint64()
		for range r.IntN(3) {
			m &= r.Uint64()
		}
		for range r.IntN(3) {
			m |= r.Uint64()
		}
		masks = append(masks, m)
	}
	for i := range 1 << 16 {
		masks = append(masks, uint64(i), uint64(i)<<48, bits.RotateLeft64(uint64(i), 40))
	}
	for _, m := range masks {
		esc, last := escaped(m)
		wantEsc, wantLast := walk(m)
		if esc != wantEsc || last != wantLast {
			t.Fatalf("escaped(%064b) = %064b, %v; want %064b, %v", m, esc, last, wantEsc, wantLast)
		}
	}
}

// TestBlockPathAgrees scans generated bodies with long strings (code,
// backslash runs, \u escapes, faults of each kind, cut at any point) with
// the block path and without: the same fields, or the same error at the
// same byte.
func TestBlockPathAgrees(t *testing.T) {
	pieces := []string{"plain words ", `\n`, `\t`, `\"`, `\\`, `\/`, `\u00e9`, `\uD83D\uDE00`, `\\\\\\`, `\\\"`,
		"é", "日本", strings.Repeat("x", 70), `if err != nil {`}
	faults := []string{`\q`, `\u00z1`, `\u12`, "\x01", "\x1f", `"`, `\`, `\u`, "\"x"}
	r := rand.New(rand.NewPCG(5, 6))
	blockRuns := 0
	for n := range 20000 {
		var v strings.Builder
		for v.Len() < 40+r.IntN(400) {
			v.WriteString(pieces[r.IntN(len(pieces))])
		}
		if n%3 == 0 { // a fault somewhere
			s := v.String()
			at := r.IntN(len(s) + 1)
			v.Reset()
			v.WriteString(s[:at] + faults[r.IntN(len(faults))] + s[at:])
		}
		pad := strings.Repeat(" ", r.IntN(64))
		doc := `{"model":"m",` + pad + `"messages":[{"role":"user","content":"` + v.String() + `"}],"user":"` + v.String()[:r.IntN(v.Len())/4] + `"}`
		if n%5 == 0 { // cut short
			doc = doc[:r.IntN(len(doc)+1)]
		}
		b1, err1 := scanWith([]byte(doc), true)
		b2, err2 := scanWith([]byte(doc), false)
		if errString(err1) != errString(err2) || b1.Model != b2.Model || b1.User != b2.User ||
			string(b1.fallback[KeyMessages-KeySystem]) != string(b2.fallback[KeyMessages-KeySystem]) {
			t.Fatalf("%q:\nblocks: %+v, %v\nwords:  %+v, %v", doc, b1, err1, b2, err2)
		}
		if len(doc) > 200 {
			blockRuns++
		}
	}
	if blockRuns < 10000 {
		t.Fatalf("only %d bodies long enough for the block path", blockRuns)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestASCIIPrefix: asciiPrefix stops at the first 128-byte block holding
// a byte >= 0x80, at every length and position, and ValidUTF8 agrees
// with utf8.Valid on ASCII runs ending in valid and invalid sequences.
func TestASCIIPrefix(t *testing.T) {
	ref := func(d []byte) int {
		n := 0
		for ; n+128 <= len(d); n += 128 {
			if bytes.IndexFunc(d[n:n+128], func(r rune) bool { return r >= 0x80 }) >= 0 {
				break
			}
		}
		return n
	}
	base := bytes.Repeat([]byte("abcdefgh\"\\\n\t{}:, 0123"), 40) // 840 bytes
	for n := 0; n <= len(base); n++ {
		d := base[:n]
		if got := asciiPrefix(d); got != ref(d) && !(got == 0 && !blockScan) {
			t.Fatalf("len %d, all ASCII: asciiPrefix %d, want %d", n, got, ref(d))
		}
		for _, at := range []int{0, 1, 63, 64, 127, 128, 129, 255, 256, n - 1} {
			if at < 0 || at >= n {
				continue
			}
			for _, hi := range []byte{0x80, 0xc3, 0xff} {
				e := bytes.Clone(d)
				e[at] = hi
				got := asciiPrefix(e)
				if got != ref(e) && !(got == 0 && !blockScan) {
					t.Fatalf("len %d, %#x at %d: asciiPrefix %d, want %d", n, hi, at, got, ref(e))
				}
				if ValidUTF8(e) != utf8.Valid(e) {
					t.Fatalf("len %d, %#x at %d: ValidUTF8 %v, utf8.Valid %v", n, hi, at, ValidUTF8(e), utf8.Valid(e))
				}
			}
		}
	}
	for _, tail := range []string{"é", "\xc3", "€x", "\xe2\x82", "😀", "\xf0\x9f\x98", "\xed\xa0\x80"} {
		for _, n := range []int{0, 100, 127, 128, 200, 256, 511} {
			d := append(bytes.Repeat([]byte("x"), n), tail...)
			if ValidUTF8(d) != utf8.Valid(d) {
				t.Errorf("%d bytes of ASCII then %q: ValidUTF8 %v, utf8.Valid %v", n, tail, ValidUTF8(d), utf8.Valid(d))
			}
		}
	}
}

func FuzzValidUTF8(f *testing.F) {
	for _, s := range []string{"", "abc", strings.Repeat("a", 300) + "é", strings.Repeat("b", 128) + "\xff" + strings.Repeat("c", 200), "\xc3" + strings.Repeat("x", 130)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, d []byte) {
		if ValidUTF8(d) != utf8.Valid(d) {
			t.Fatalf("ValidUTF8 %v, utf8.Valid %v", ValidUTF8(d), utf8.Valid(d))
		}
		if n := asciiPrefix(d); n%128 != 0 || n > len(d) || bytes.IndexFunc(d[:n], func(r rune) bool { return r >= 0x80 }) >= 0 {
			t.Fatalf("asciiPrefix %d of %d bytes: not an ASCII run of whole blocks", n, len(d))
		}
	})
}
