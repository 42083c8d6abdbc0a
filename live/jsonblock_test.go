package live

import (
	"math/bits"
	"math/rand/v2"
	"strings"
	"testing"
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
		b1, err1 := scanBodyWith([]byte(doc), true)
		b2, err2 := scanBodyWith([]byte(doc), false)
		if errString(err1) != errString(err2) || b1.Model != b2.Model || b1.User != b2.User ||
			string(b1.fallback[keyMessages-keySystem]) != string(b2.fallback[keyMessages-keySystem]) {
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
