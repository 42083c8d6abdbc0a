package traces

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

func importBytes(t testing.TB, format string, data []byte, opts ImportOptions) ([]Request, ImportResult, error) {
	t.Helper()
	var buf bytes.Buffer
	if opts.BlockSize == 0 {
		opts.BlockSize = 16
	}
	w := NewWriter(&buf, Header{BlockSize: opts.BlockSize, Source: format})
	res, err := Import(format, bytes.NewReader(data), "in", w, opts)
	if err != nil {
		return nil, res, err
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rd, err := NewReader(&buf, "out", ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []Request
	for {
		r, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return out, res, nil
		}
		if err != nil {
			t.Fatalf("the importer wrote a trace that does not read back: %v", err)
		}
		out = append(out, r.Clone())
	}
}

// TestImportGolden imports each fixture and compares the trace with a
// golden file (go test -run TestImportGolden -update rewrites them).
func TestImportGolden(t *testing.T) {
	for _, tc := range []struct {
		format, in string
		block      int
	}{
		{"mooncake", "mooncake_small.jsonl", 256},
		{"bailian", "bailian_small.jsonl", 32},
		{"azure", "azure_small.csv", 16},
	} {
		t.Run(tc.format, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", tc.in))
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			w := NewWriter(&buf, Header{BlockSize: tc.block, Source: tc.format + ":" + tc.in})
			if _, err := Import(tc.format, bytes.NewReader(data), tc.in, w, ImportOptions{BlockSize: tc.block}); err != nil {
				t.Fatal(err)
			}
			w.Close()
			golden := filepath.Join("testdata", tc.in+".golden")
			if *update {
				if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if d := cmp.Diff(string(want), buf.String()); d != "" {
				t.Fatalf("golden %s differs (-want +got):\n%s", golden, d)
			}
		})
	}
}

func sessionsAndTurns(reqs []Request) []string {
	var out []string
	for _, r := range reqs {
		out = append(out, fmt.Sprintf("%s/%d@%d+%d", r.Session, r.Turn, r.ArrivalMs, r.ThinkMs))
	}
	return out
}

func TestImportMooncakeFixture(t *testing.T) {
	data, _ := os.ReadFile("testdata/mooncake_small.jsonl")
	reqs, res, err := importBytes(t, "mooncake", data, ImportOptions{BlockSize: 256})
	if err != nil {
		t.Fatal(err)
	}
	// See infer.go's rule: line 2 continues line 1 (it repeats line 1's two
	// full 512-token ids); line 4 repeats only content that line 1 already
	// had, so line 5 cannot continue it; line 6 continues line 2.
	want := []string{"m0000000/0@0+0", "m0000000/1@10+10", "m0000001/0@20+0", "m0000002/0@30+0", "m0000003/0@40+0", "m0000000/2@50+40"}
	if d := cmp.Diff(want, sessionsAndTurns(reqs)); d != "" {
		t.Fatalf("sessions (-want +got):\n%s", d)
	}
	if res.Requests != 6 || res.Sessions != 4 {
		t.Fatalf("result %+v", res)
	}
	// 1300 tokens at 256: ids 1 and 2 give 2 children each, id 3 covers the
	// remaining 276 tokens: 2 blocks. ceil(1300/256) = 6.
	if n := len(reqs[0].HashIDs); n != 6 {
		t.Fatalf("%d blocks, want 6", n)
	}
	// Shared ids stay shared block for block, and the chain diverges at the
	// first different id.
	if !slices.Equal(reqs[0].HashIDs[:4], reqs[1].HashIDs[:4]) || reqs[0].HashIDs[4] == reqs[1].HashIDs[4] {
		t.Fatal("lines 1 and 2 should share exactly their first 4 blocks")
	}
}

// mooncakeTraces are the Mooncake-format files the importer is tested on:
// testdata/mooncake-fixture.jsonl, our own (300 requests of conversations
// that extend their prefixes, shared system prompts and one-shot
// requests, made for these tests), and the first 300 requests of the public
// trace when ../shared/testdata has it (a clone alone does not: the test
// then runs on the fixture only).
func mooncakeTraces(t *testing.T) map[string][]byte {
	out := map[string][]byte{}
	for _, path := range []string{
		filepath.Join("testdata", "mooncake-fixture.jsonl"),
		filepath.Join("..", "..", "shared", "testdata", "mooncake-synthetic-head300.jsonl"),
	} {
		data, err := os.ReadFile(path)
		if err != nil {
			if len(out) == 0 {
				t.Fatal(err)
			}
			t.Logf("%v: the public trace's case is left out", err)
			continue
		}
		out[filepath.Base(path)] = data
	}
	return out
}

func TestImportMooncakeHead300(t *testing.T) {
	for name, data := range mooncakeTraces(t) {
		t.Run(name, func(t *testing.T) { testImportMooncake(t, data) })
	}
}

func testImportMooncake(t *testing.T, data []byte) {
	var src []mooncakeRecord
	for _, l := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		var rec mooncakeRecord
		if err := json.Unmarshal(l, &rec); err != nil {
			t.Fatal(err)
		}
		src = append(src, rec)
	}
	for _, B := range []int{16, 64} {
		reqs, _, err := importBytes(t, "mooncake", data, ImportOptions{BlockSize: B})
		if err != nil {
			t.Fatal(err)
		}
		if len(reqs) != len(src) {
			t.Fatalf("%d requests, want %d", len(reqs), len(src))
		}
		per := MooncakeBlockTokens / B
		for i, r := range reqs {
			if want := ceilDiv(*src[i].InputLength, B); len(r.HashIDs) != want {
				t.Fatalf("B=%d line %d: %d blocks, want ceil(%d/%d) = %d", B, i+1, len(r.HashIDs), *src[i].InputLength, B, want)
			}
		}
		// Shared ids stay shared block for block: two requests agree on
		// exactly per x (their common Mooncake prefix) blocks when they differ
		// afterwards.
		pairs := 0
		for i := range reqs {
			for j := i + 1; j < len(reqs); j++ {
				a, b := src[i].HashIDs, src[j].HashIDs
				m := 0
				for m < min(len(a), len(b)) && a[m] == b[m] {
					m++
				}
				if m == min(len(a), len(b)) {
					continue // one is a prefix of the other: no divergence to check
				}
				x, y := reqs[i].HashIDs, reqs[j].HashIDs
				c := 0
				for c < min(len(x), len(y)) && x[c] == y[c] {
					c++
				}
				if c != m*per {
					t.Fatalf("B=%d lines %d and %d share %d Mooncake ids but %d blocks, want %d", B, i+1, j+1, m, c, m*per)
				}
				if m > 0 {
					pairs++
				}
			}
		}
		if pairs == 0 {
			t.Fatal("no pair of requests shares a prefix: the check checked nothing")
		}
		// The reuse bound counts a block as reused exactly when its Mooncake
		// id appeared before at the same position: recount it that way.
		var buf bytes.Buffer
		w := NewWriter(&buf, Header{BlockSize: B})
		for i := range reqs {
			w.Write(&reqs[i])
		}
		w.Close()
		rd, _ := NewReader(&buf, "head300", ReaderOptions{})
		st, err := Stats(rd)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[uint64]bool{}
		var full, reused int64
		for _, rec := range src {
			in := *rec.InputLength
			for k := range in / B {
				id := rec.HashIDs[k/per]
				if seen[id] {
					reused++
				}
				full++
			}
			for _, id := range rec.HashIDs[:ceilDiv(in/B, per)] {
				seen[id] = true
			}
		}
		if st.Requests != 300 || st.FullBlocks != full || st.ReusedBlocks != reused {
			t.Fatalf("B=%d: stats %d requests, %d/%d reused, want 300, %d/%d", B, st.Requests, st.ReusedBlocks, st.FullBlocks, reused, full)
		}
	}
}

func TestImportBailianFixture(t *testing.T) {
	data, _ := os.ReadFile("testdata/bailian_small.jsonl")
	reqs, res, err := importBytes(t, "bailian", data, ImportOptions{BlockSize: 32})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"b1/0@0+0", "b2/0@500+0", "b1/1@1250+1250", "b1/2@3000+1750", "b99/0@3000+0"}
	if d := cmp.Diff(want, sessionsAndTurns(reqs)); d != "" {
		t.Fatalf("sessions (-want +got):\n%s", d)
	}
	if res.Sessions != 3 {
		t.Fatalf("result %+v", res)
	}
	// 16-token ids grouped two by two: [11 12] [13] vs [11 12] [14 15] [16].
	if len(reqs[0].HashIDs) != 2 || reqs[0].HashIDs[0] != reqs[2].HashIDs[0] || reqs[0].HashIDs[1] == reqs[2].HashIDs[1] {
		t.Fatalf("regrouping: %v vs %v", reqs[0].HashIDs, reqs[2].HashIDs)
	}
	if !slices.Equal(reqs[2].HashIDs[:2], reqs[3].HashIDs[:2]) {
		t.Fatal("turns 1 and 2 of b1 should share two 32-token blocks")
	}
}

func TestImportAzureFixture(t *testing.T) {
	data, _ := os.ReadFile("testdata/azure_small.csv")
	reqs, res, err := importBytes(t, "azure", data, ImportOptions{BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"z0000000/0@0+0", "z0000001/0@4314+0", "z0000002/0@4314+0"}
	if d := cmp.Diff(want, sessionsAndTurns(reqs)); d != "" {
		t.Fatalf("sessions (-want +got):\n%s", d)
	}
	seen := map[uint64]bool{}
	for _, r := range reqs {
		for _, id := range r.HashIDs {
			if seen[id] {
				t.Fatal("an Azure prompt shares a block")
			}
			seen[id] = true
		}
	}
	if res.Sessions != 3 || len(reqs[0].HashIDs) != 24 || reqs[2].OutputTokens != 0 {
		t.Fatalf("result %+v, %d blocks", res, len(reqs[0].HashIDs))
	}
}

func TestImportErrors(t *testing.T) {
	mc := func(s string) string {
		return `{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}` + "\n" + s
	}
	bl := func(s string) string {
		return `{"chat_id": 1, "parent_chat_id": -1, "timestamp": 5, "input_length": 20, "output_length": 1, "hash_ids": [1, 2]}` + "\n" + s
	}
	az := func(s string) string {
		return "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,1\n" + s
	}
	tests := []struct {
		format, in, err string
		block           int
	}{
		{"mooncake", mc(`{"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [1]}`), "in:2: hash_ids: expected ceil(input_length/512) = ceil(600/512) = 2 ids, got 1", 16},
		{"mooncake", mc(`{"input_length": 6, "output_length": 1, "hash_ids": [1]}`), "in:2: timestamp: required", 16},
		{"mooncake", mc(`{"timestamp": -1, "input_length": 6, "output_length": 1, "hash_ids": [1]}`), "in:2: timestamp: must be ms", 16},
		{"mooncake", `{"timestamp": 5, "input_length": 6, "output_length": 1, "hash_ids": [1]}` + "\n" + `{"timestamp": 4, "input_length": 6, "output_length": 1, "hash_ids": [1]}`, "in:2: timestamp: 4 is before the previous line's 5", 16},
		{"mooncake", mc(`{"timestamp": 1, "input_length": "x"}`), "in:2: input_length: expected int", 16},
		{"mooncake", mc(`not json`), "in:2: invalid JSON", 16},
		{"mooncake", mc(""), "import: block size 24 does not divide", 24},
		{"bailian", bl(`{"chat_id": 2, "timestamp": 6, "input_length": 20, "output_length": 1, "hash_ids": [1, 2]}`), "in:2: parent_chat_id: required", 16},
		{"bailian", bl(`{"chat_id": 2, "parent_chat_id": -1, "timestamp": 6, "input_length": 20, "output_length": -1, "hash_ids": [1, 2]}`), "in:2: output_length: must be in [0, 2^30], got -1", 16},
		{"bailian", bl(`{"chat_id": 2, "parent_chat_id": -1, "timestamp": 6, "input_length": 40, "output_length": 1, "hash_ids": [1, 2]}`), "in:2: hash_ids: expected ceil(input_length/16) = ceil(40/16) = 3 ids, got 2", 16},
		{"azure", az("2023-11-16 18:15:47,abc,1"), "in:3: ContextTokens: expected an integer in [1, 2^30], got \"abc\"", 16},
		{"azure", az("yesterday,5,1"), "in:3: TIMESTAMP: expected a time like", 16},
		{"azure", az("2023-11-16 18:15:40,5,1"), "in:3: TIMESTAMP: 2023-11-16T18:15:40Z is before the previous row's", 16},
		{"azure", az("2023-11-16 18:15:47"), "in:3: expected at least 3 fields, got 1", 16},
		{"azure", "TIMESTAMP,Context\n", "in:1: ContextTokens: missing column", 16},
		{"azure", "", "in:1: missing the header row", 16},
		{"parquet", "", `import: unknown format "parquet"`, 16},
	}
	for _, tc := range tests {
		t.Run(tc.err, func(t *testing.T) {
			_, _, err := importBytes(t, tc.format, []byte(tc.in), ImportOptions{BlockSize: tc.block})
			if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
				t.Fatalf("error\n  %v\nwant prefix\n  %s", err, tc.err)
			}
		})
	}
}

func TestImportSkipBad(t *testing.T) {
	in := "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,10,1\nbad,1,1\n2023-11-16 18:15:47,x,1\n2023-11-16 18:15:48,10,1\n"
	reqs, res, err := importBytes(t, "azure", []byte(in), ImportOptions{BlockSize: 16, SkipBad: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 2 || res.Skipped != 2 || res.Requests != 2 {
		t.Fatalf("%d requests, result %+v", len(reqs), res)
	}
}

// Session inference recovers the sessions of an interleaved synthetic trace
// whose session ids were erased.
func TestInferSessionsOfSyntheticTrace(t *testing.T) {
	w := DefaultWorkload()
	w.Turns = 4
	const B = 16
	sessions := takeSessions(NewGenerator(w, B, 9), 24)
	var reqs []Request
	for i := 0; i < len(sessions); i += 6 { // 6 concurrent sessions
		for turn := range w.Turns {
			for _, s := range sessions[i : i+6] {
				reqs = append(reqs, s.Turns[turn])
			}
		}
	}
	inf := NewSessionInferrer("x")
	got := map[string]string{} // inferred -> true
	for i := range reqs {
		r := reqs[i].Clone()
		truth := r.Session
		inf.Assign(&r, r.PromptTokens/B)
		if prev, ok := got[r.Session]; ok && prev != truth {
			t.Fatalf("request %d: inferred %s mixes %s and %s", i, r.Session, prev, truth)
		}
		got[r.Session] = truth
		if r.Turn != reqs[i].Turn {
			t.Fatalf("request %d: turn %d, want %d", i, r.Turn, reqs[i].Turn)
		}
	}
	if inf.Sessions() != len(sessions) {
		t.Fatalf("inferred %d sessions, want %d", inf.Sessions(), len(sessions))
	}
}

func fuzzImport(f *testing.F, format string, seeds ...string) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, skip := range []bool{false, true} {
			w := NewWriter(io.Discard, Header{BlockSize: 16})
			_, err := Import(format, bytes.NewReader(data), "fuzz", w, ImportOptions{BlockSize: 16, SkipBad: skip})
			var le *LineError
			if err != nil && !errors.As(err, &le) {
				// Everything else is an I/O error or a request the writer
				// rejected: the importer let a bad record through.
				if strings.HasPrefix(err.Error(), "trace request") {
					t.Fatalf("importer produced an invalid request: %v", err)
				}
			}
		}
	})
}

func FuzzImportMooncake(f *testing.F) {
	data, _ := os.ReadFile("testdata/mooncake_small.jsonl")
	fuzzImport(f, "mooncake", string(data), `{"timestamp": 1e300, "input_length": 1, "output_length": 0, "hash_ids": [0]}`)
}

func FuzzImportBailian(f *testing.F) {
	data, _ := os.ReadFile("testdata/bailian_small.jsonl")
	fuzzImport(f, "bailian", string(data))
}

func FuzzImportAzure(f *testing.F) {
	data, _ := os.ReadFile("testdata/azure_small.csv")
	fuzzImport(f, "azure", string(data), "TIMESTAMP,ContextTokens,GeneratedTokens\n\"a\"b,1,1\n1.5,1,1\n")
}
