package traces

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func statsOf(t *testing.T, body string) TraceStats {
	t.Helper()
	rd, err := NewReader(strings.NewReader(body), "t.jsonl", ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := Stats(rd)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// A hand-worked trace (block size 4); the numbers are derived in the
// comments.
func TestStatsHandWorked(t *testing.T) {
	body := testHeader + `
{"t_ms":0,"session":"a","turn":0,"prompt_tokens":10,"output_tokens":2,"hash_ids":[1,2,3],"output_hash_ids":[4]}
{"t_ms":30000,"session":"b","turn":0,"prompt_tokens":8,"output_tokens":0,"hash_ids":[1,2]}
{"t_ms":90000,"session":"a","turn":1,"prompt_tokens":14,"output_tokens":2,"hash_ids":[1,2,4,5]}
{"t_ms":500000,"session":"c","turn":0,"prompt_tokens":4,"output_tokens":0,"hash_ids":[9]}
`
	got := statsOf(t, body)
	want := TraceStats{
		BlockSize: 4, Requests: 4, Sessions: 3,
		TurnsPerSessionP50: 1, TurnsPerSessionMax: 2,
		DurationS: 500, PromptTokens: 36, OutputTokens: 4,
		ContextTokensP50: 8, ContextTokensP90: 14, ContextTokensP99: 14, ContextTokensMax: 14,
		PromptTokensPerMin: 36 / (500.0 / 60), OutputTokensPerMin: 4 / (500.0 / 60),
		// full blocks 2+2+3+1; reused: b's 1,2; a's 1,2 and 4 (an output block).
		FullBlocks: 8, ReusedBlocks: 5, DistinctBlocks: 4, // {1,2,4,9}: 3 and 5 are partial
		ReuseUpperBoundPct: 62.5, ReuseUpperBoundTokenPct: 100 * 20.0 / 36,
		// Samples at 60..480 s and at the end (500 s): a and b hold 20, then
		// 24 after a's second turn; b expires at 330 s, a at 390 s; c holds 4.
		SessionTTLS: 300, WorkingSetSamples: 9,
		ActiveSessionsP50: 2, ActiveSessionsMax: 2,
		WorkingSetTokensP50: 20, WorkingSetTokensMax: 24,
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
}

func TestStatsEmptyAndSingle(t *testing.T) {
	if st := statsOf(t, testHeader+"\n"); st.Requests != 0 || st.ReuseUpperBoundPct != 0 {
		t.Fatalf("empty: %+v", st)
	}
	st := statsOf(t, testHeader+"\n"+line(7, "a", ""))
	if st.Requests != 1 || st.WorkingSetSamples != 1 || st.WorkingSetTokensMax != 13 || st.PromptTokensPerMin != 0 {
		t.Fatalf("single: %+v", st)
	}
}

// The reuse bound equals a brute-force count over generated sessions.
func TestStatsReuseMatchesBruteForce(t *testing.T) {
	w := DefaultWorkload()
	w.SubagentProbability = 0.2
	for _, B := range []int{16, 32} {
		sessions := takeSessions(NewGenerator(w, B, 5), 40)
		var buf bytes.Buffer
		wr := NewWriter(&buf, Header{BlockSize: B})
		seen := map[uint64]bool{}
		var full, reused int
		// Interleave the sessions four at a time, as a closed loop would.
		for i := 0; i < len(sessions); i += 4 {
			group := sessions[i:min(i+4, len(sessions))]
			for turn := 0; ; turn++ {
				any := false
				for _, s := range group {
					if turn >= len(s.Turns) {
						continue
					}
					any = true
					r := s.Turns[turn]
					if err := wr.Write(&r); err != nil {
						t.Fatal(err)
					}
					f := r.PromptTokens / B
					for _, id := range r.HashIDs[:f] {
						if seen[id] {
							reused++
						}
					}
					full += f
					for _, id := range r.HashIDs[:f] {
						seen[id] = true
					}
					for _, id := range r.OutputHashIDs {
						seen[id] = true
					}
				}
				if !any {
					break
				}
			}
		}
		wr.Close()
		st := statsOf(t, buf.String())
		if st.FullBlocks != int64(full) || st.ReusedBlocks != int64(reused) {
			t.Fatalf("B=%d: full %d reused %d, brute force %d %d", B, st.FullBlocks, st.ReusedBlocks, full, reused)
		}
		// Six turns, each repeating the previous prompt and answer: most
		// blocks are reused.
		if st.ReuseUpperBoundPct < 70 || st.ReuseUpperBoundPct > 95 {
			t.Fatalf("B=%d: reuse bound %.1f%% outside the expected 70-95%%", B, st.ReuseUpperBoundPct)
		}
		if st.ReuseUpperBoundTokenPct > st.ReuseUpperBoundPct {
			t.Fatal("the token bound exceeds the block bound")
		}
	}
}

func TestLogHist(t *testing.T) {
	var h logHist
	for v := range int64(100_000) {
		h.add(v)
	}
	for _, q := range []float64{0.5, 0.9, 0.99} {
		got, want := float64(h.quantile(q)), q*100_000
		if got < want*0.99 || got > want*1.01 {
			t.Fatalf("q%.2f = %v, want %v within 1%%", q, got, want)
		}
	}
	for i := range histBuckets - 1 {
		if histLower(i) >= histLower(i+1) || histIndex(histLower(i)) != i {
			t.Fatalf("bucket %d: lower %d, next %d", i, histLower(i), histLower(i+1))
		}
	}
}
