package traces

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const testHeader = `{"format":"warden-trace","version":1,"block_size":4}`

// line is a valid request for block size 4 with 10 prompt tokens.
func line(t int64, session string, extra string) string {
	return fmt.Sprintf(`{"t_ms":%d,"session":%q,"turn":0,"prompt_tokens":10,"output_tokens":3,"hash_ids":[1,2,3]%s}`, t, session, extra)
}

func TestRoundTripSessions(t *testing.T) {
	w := DefaultWorkload()
	w.SubagentProbability = 0.5
	want := takeSessions(NewGenerator(w, 16, 42), 12)
	for _, name := range []string{"t.jsonl", "t.jsonl.gz"} {
		path := filepath.Join(t.TempDir(), name)
		wr, err := Create(path, Header{BlockSize: 16, Source: "test", Concurrency: 4})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range want {
			for i := range s.Turns {
				if err := wr.Write(&s.Turns[i]); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := wr.Close(); err != nil {
			t.Fatal(err)
		}
		got, h, err := LoadSessions(path)
		if err != nil {
			t.Fatal(err)
		}
		wantH := Header{Format: Format, Version: 1, BlockSize: 16, Source: "test", Concurrency: 4}
		if h != wantH {
			t.Fatalf("%s: header %+v, want %+v", name, h, wantH)
		}
		// ParentTurn and SharedTokens are not part of the record.
		exp := make([]Session, len(want))
		for i, s := range want {
			exp[i] = s
			exp[i].ParentTurn, exp[i].SharedTokens = -1, 0
		}
		if d := cmp.Diff(exp, got); d != "" {
			t.Fatalf("%s: round trip (-want +got):\n%s", name, d)
		}
	}
}

func TestReaderBadLines(t *testing.T) {
	tests := []struct {
		name, body, err string
	}{
		{"empty file", "", "t.jsonl:1: missing header"},
		{"no header", line(0, "a", "") + "\n", "t.jsonl:1: t_ms: header: unknown key"},
		{"wrong version", `{"format":"warden-trace","version":2,"block_size":16}`, "t.jsonl:1: version: header: expected 1, got 2"},
		{"wrong format", `{"format":"x","version":1,"block_size":16}`, `t.jsonl:1: format: header: expected "warden-trace"`},
		{"zero block size", `{"format":"warden-trace","version":1}`, "t.jsonl:1: block_size: header: must be >= 1"},
		{"unknown key", testHeader + "\n" + line(0, "a", `,"colour":1`), "t.jsonl:2: colour: unknown key"},
		{"negative tokens", testHeader + "\n" + strings.Replace(line(0, "a", ""), `"output_tokens":3`, `"output_tokens":-3`, 1), "t.jsonl:2: output_tokens: must be >= 0, got -3"},
		{"hash count", testHeader + "\n" + strings.Replace(line(0, "a", ""), "[1,2,3]", "[1,2]", 1), "t.jsonl:2: hash_ids: expected ceil(prompt_tokens/block_size) = ceil(10/4) = 3 ids, got 2"},
		{"output hash count", testHeader + "\n" + line(0, "a", `,"output_hash_ids":[1,2]`), "t.jsonl:2: output_hash_ids: expected floor((prompt+output)/block_size) - floor(prompt/block_size) = 1 ids (or none), got 2"},
		{"non-monotonic", testHeader + "\n" + line(5, "a", "") + "\n\n" + line(4, "b", ""), "t.jsonl:4: t_ms: arrival 4 is before the previous request's 5"},
		{"wrong type", testHeader + "\n" + `{"t_ms":"soon"}`, "t.jsonl:2: t_ms: expected int64, got JSON string"},
		{"negative hash id", testHeader + "\n" + strings.Replace(line(0, "a", ""), "[1,2,3]", "[1,-2,3]", 1), "t.jsonl:2: hash_ids: expected uint64"},
		{"syntax", testHeader + "\n" + `{"t_ms":1,`, "t.jsonl:2: invalid JSON"},
		{"two objects", testHeader + "\n" + line(0, "a", "") + line(0, "a", ""), "t.jsonl:2: unexpected data after the JSON object"},
		{"stray bracket", testHeader + "\n" + line(0, "a", "") + "}", "t.jsonl:2: unexpected data after the JSON object"},
		{"header trailing data", testHeader + ` {"x":1}`, "t.jsonl:1: header: unexpected data after the JSON object"},
		{"empty session", testHeader + "\n" + line(0, "", ""), "t.jsonl:2: session: required"},
		{"cached beyond prompt", testHeader + "\n" + line(0, "a", `,"cached_tokens":11`), "t.jsonl:2: cached_tokens: must be -1 (unknown) or in [0, prompt_tokens=10], got 11"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := readAll(strings.NewReader(tc.body), ReaderOptions{})
			if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
				t.Fatalf("error\n  %v\nwant prefix\n  %s", err, tc.err)
			}
			var le *LineError
			if !errors.As(err, &le) {
				t.Fatalf("%T is not a *LineError", err)
			}
		})
	}
}

func readAll(r io.Reader, opts ReaderOptions) error {
	rd, err := NewReader(r, "t.jsonl", opts)
	if err != nil {
		return err
	}
	for {
		if _, err := rd.Next(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

func TestReaderSkipBadAndDefaults(t *testing.T) {
	body := strings.Join([]string{
		testHeader,
		line(0, "a", ""),
		`garbage`,
		line(3, "a", `,"turn":-1`),
		line(2, "b", `,"cached_tokens":4,"replica":2`),
		line(1, "c", ""), // before the previous kept request: bad
		line(2, "c", ""),
	}, "\r\n") // CRLF is accepted
	rd, err := NewReader(strings.NewReader(body), "t.jsonl", ReaderOptions{SkipBad: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		r, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s@%d cached=%d replica=%d", r.Session, r.ArrivalMs, r.CachedTokens, r.Replica))
	}
	want := []string{"a@0 cached=-1 replica=-1", "b@2 cached=4 replica=2", "c@2 cached=-1 replica=-1"}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
	if rd.Skipped() != 3 {
		t.Fatalf("skipped %d, want 3", rd.Skipped())
	}
}

func TestReaderGzipAndLongLines(t *testing.T) {
	// A prompt with 100k blocks: a line far longer than the bufio buffer.
	ids := make([]string, 100_000)
	for i := range ids {
		ids[i] = fmt.Sprint(uint64(1)<<63 + uint64(i))
	}
	long := fmt.Sprintf(`{"t_ms":0,"session":"a","turn":0,"prompt_tokens":400000,"output_tokens":0,"hash_ids":[%s]}`, strings.Join(ids, ","))
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	io.WriteString(gz, testHeader+"\n"+long+"\n"+line(1, "b", ""))
	gz.Close()
	rd, err := NewReader(&buf, "t.jsonl.gz", ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := rd.Next()
	if err != nil || len(r.HashIDs) != 100_000 || r.HashIDs[99_999] != 1<<63+99_999 {
		t.Fatalf("long line: %v", err)
	}
	if r, err = rd.Next(); err != nil || r.Session != "b" || rd.Line() != 3 {
		t.Fatalf("after the long line: %v %+v line %d", err, r, rd.Line())
	}
	if _, err = rd.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("want EOF, got %v", err)
	}
}

func TestWriterRejectsBadRequests(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf, Header{BlockSize: 4})
	good := Request{ArrivalMs: 5, Session: "a", PromptTokens: 5, CachedTokens: -1, Replica: -1, HashIDs: []uint64{1, 2}}
	if err := w.Write(&good); err != nil {
		t.Fatal(err)
	}
	bad := good
	bad.ArrivalMs = 4
	if err := w.Write(&bad); err == nil || !strings.Contains(err.Error(), "t_ms") {
		t.Fatalf("want a t_ms error, got %v", err)
	}
	bad = good
	bad.HashIDs = nil
	if err := w.Write(&bad); err == nil || !strings.Contains(err.Error(), "hash_ids") {
		t.Fatalf("want a hash_ids error, got %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(buf.String(), "\n"); n != 2 || w.Count() != 1 {
		t.Fatalf("wrote %d lines, %d requests:\n%s", n, w.Count(), buf.String())
	}
	if err := NewWriter(io.Discard, Header{}).Close(); err == nil {
		t.Fatal("a header without block size was accepted")
	}
}

func FuzzReader(f *testing.F) {
	f.Add([]byte(testHeader + "\n" + line(0, "a", "") + "\n" + line(1, "b", `,"output_hash_ids":[9]`)))
	f.Add([]byte(testHeader + "\n" + `{"t_ms":1,`))
	f.Add([]byte(`{"format":"warden-trace","version":1,"block_size":1,"concurrency":3}` + "\n" + `{"t_ms":0,"session":"x","prompt_tokens":1,"hash_ids":[18446744073709551615]}`))
	f.Add([]byte{0x1f, 0x8b, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, skip := range []bool{false, true} {
			rd, err := NewReader(bytes.NewReader(data), "fuzz", ReaderOptions{SkipBad: skip})
			if err != nil {
				continue
			}
			B := rd.Header().BlockSize
			prev := int64(-1)
			for {
				r, err := rd.Next()
				if err != nil {
					break
				}
				// Whatever the reader accepts obeys the format's rules.
				if len(r.HashIDs) != ceilDiv(r.PromptTokens, B) || r.ArrivalMs < prev || r.Session == "" {
					t.Fatalf("accepted a bad request %+v", r)
				}
				prev = r.ArrivalMs
				// And writes back.
				w := NewWriter(io.Discard, rd.Header())
				if err := w.Write(r); err != nil {
					t.Fatalf("accepted request does not write: %v", err)
				}
			}
		}
	})
}

// failWriter fails every write (a full disk).
type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestWriterErrAndFlush(t *testing.T) {
	w := NewWriter(failWriter{}, Header{BlockSize: 16})
	if err := w.Write(&Request{Session: "s", PromptTokens: 0}); err == nil || w.Err() != nil {
		t.Fatalf("a request the rules refuse: Write = %v, Err = %v; want an error and no sticky one", err, w.Err())
	}
	if err := w.Write(&Request{Session: "s", PromptTokens: 1, HashIDs: []uint64{1}}); err != nil {
		t.Fatalf("buffered Write = %v", err)
	}
	if err := w.Flush(); err == nil || w.Err() == nil {
		t.Fatalf("Flush to a failing writer = %v, Err = %v; want both set", err, w.Err())
	}
	if err := w.Write(&Request{Session: "s", PromptTokens: 1, HashIDs: []uint64{1}}); err == nil {
		t.Error("Write after a failed flush succeeded")
	}
}

// Line returns the line number of the last line read.
func (r *Reader) Line() int { return r.line }
