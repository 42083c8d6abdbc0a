package traces

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

// failingReader returns its data, then err.
type failingReader struct {
	data []byte
	err  error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if len(f.data) == 0 {
		return 0, f.err
	}
	n := copy(p, f.data)
	f.data = f.data[n:]
	return n, nil
}

// TestReadAllAgreesWithNext reads traces good and bad with ReadAll, in
// batches of a few lines on several goroutines, and with Next: the same
// requests, the same first error (line and field), the same lines skipped.
func TestReadAllAgreesWithNext(t *testing.T) {
	defer goleak.VerifyNone(t)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	defer func(n int) { readAllBatchBytes = n }(readAllBatchBytes)

	good := func(n int) []string {
		var ls []string
		for i := range n {
			ls = append(ls, line(int64(i), fmt.Sprintf("s%d", i%7), ""))
		}
		return ls
	}
	with := func(ls []string, at int, l string) []string {
		ls = append([]string(nil), ls...)
		ls[at] = l
		return ls
	}
	longLine := `{"t_ms":1,"session":"x","hash_ids":[` + strings.Repeat("1,", MaxLineBytes/2) + `1]}`
	cases := []struct {
		name  string
		lines []string
	}{
		{"good", good(200)},
		{"empty", nil},
		{"blank lines and CRLF", append(append([]string{"", "  "}, good(30)...), "\t", line(40, "a", "")+"\r", "")},
		{"output hash ids, empty arrays", []string{
			line(0, "a", `,"output_hash_ids":[9]`),
			`{"t_ms":1,"session":"b","prompt_tokens":3,"output_tokens":1,"hash_ids":[5],"output_hash_ids":[]}`,
			`{"t_ms":2,"session":"c","prompt_tokens":8,"output_tokens":0,"hash_ids":[1,2],"model":"m","parent":"a","think_ms":5,"cached_tokens":4,"replica":2}`,
		}},
		{"slow-path line (encoding/json)", []string{line(0, "a", ""), `{"t_ms":1.0,"session":"b","prompt_tokens":10,"hash_ids":[1,2,3]}`, line(2, "c", "")}},
		{"bad JSON", with(good(100), 57, `{"t_ms":3,"session":`)},
		{"trailing data", with(good(100), 3, line(3, "x", "")+"x")},
		{"unknown key", with(good(50), 49, `{"t_ms":49,"bogus":1}`)},
		{"out of order", with(good(100), 61, line(2, "late", ""))},
		{"out of order and no session: order first", with(good(100), 61, line(2, "", ""))},
		{"negative and out of order: t_ms >= 0 first", with(good(100), 61, line(-1, "x", ""))},
		{"bad hash ids", with(good(100), 12, line(12, "x", "")[:len(line(12, "x", ""))-len(`1,2,3]}`)]+`1,2]}`)},
		{"two bad lines", with(with(good(100), 80, `{`), 20, line(20, "", ""))},
		{"order after a skipped line", append(good(10), line(100, "x", `,"bogus":1`), line(50, "y", ""))},
		{"over-long line", with(good(20), 10, longLine)},
	}
	for _, batch := range []int{1, 150, 1 << 20} {
		readAllBatchBytes = batch
		for _, c := range cases {
			for _, skip := range []bool{false, true} {
				if c.name == "over-long line" && batch != 150 {
					continue // 64 MiB: once is enough
				}
				text := testHeader + "\n" + strings.Join(c.lines, "\n")
				open := func() *Reader {
					r, err := NewReader(strings.NewReader(text), "t.jsonl", ReaderOptions{SkipBad: skip})
					if err != nil {
						t.Fatal(err)
					}
					return r
				}
				ref, got := open(), open()
				want, wantErr := ref.readAllSerial()
				have, haveErr := got.ReadAll()
				name := fmt.Sprintf("%s, skip %v, batch %d", c.name, skip, batch)
				if fmt.Sprint(haveErr) != fmt.Sprint(wantErr) {
					t.Errorf("%s: error %v, want %v", name, haveErr, wantErr)
				}
				var le, wle *LineError
				if errors.As(wantErr, &wle) && (!errors.As(haveErr, &le) || *le != *wle) {
					t.Errorf("%s: error %#v, want %#v", name, haveErr, wantErr)
				}
				if d := cmp.Diff(want, have); d != "" {
					t.Errorf("%s: requests (-Next +ReadAll):\n%s", name, d)
				}
				if got.Skipped() != ref.Skipped() {
					t.Errorf("%s: %d lines skipped, want %d", name, got.Skipped(), ref.Skipped())
				}
			}
		}
	}

	// A read error after some lines: the lines before it, then the error.
	readAllBatchBytes = 150
	data := testHeader + "\n" + strings.Join(good(40), "\n") + "\n" + line(40, "cut", "")[:20]
	for _, skip := range []bool{false, true} {
		open := func() *Reader {
			r, err := NewReader(&failingReader{data: []byte(data), err: errors.New("disk on fire")}, "t.jsonl", ReaderOptions{SkipBad: skip})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		_, wantErr := open().readAllSerial()
		_, haveErr := open().ReadAll()
		if wantErr == nil || fmt.Sprint(haveErr) != fmt.Sprint(wantErr) {
			t.Errorf("read error, skip %v: %v, want %v", skip, haveErr, wantErr)
		}
	}
}

// TestReadAllSharesNothingWritable checks that the requests ReadAll
// returns do not alias: growing one's hash ids leaves the next alone.
func TestReadAllSharesNothingWritable(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	var b bytes.Buffer
	b.WriteString(testHeader + "\n")
	for i := range 10 {
		b.WriteString(line(int64(i), "s", "") + "\n")
	}
	r, err := NewReader(&b, "t", ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reqs, err := r.ReadAll()
	if err != nil || len(reqs) != 10 {
		t.Fatalf("%d requests, %v", len(reqs), err)
	}
	_ = append(reqs[0].HashIDs, 99)
	if reqs[1].HashIDs[0] != 1 {
		t.Fatalf("appending to one request's hash ids changed the next: %v", reqs[1].HashIDs)
	}
}
