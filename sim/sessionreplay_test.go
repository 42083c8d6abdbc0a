package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"math"
	"testing"

	"github.com/lm-warden/warden/traces"
)

// replayTrace is a trace of sessions whose turns were recorded start ms
// apart (session j at j*startMs), 10 ms between turns (faster than any
// farm answers) with think_ms thinkMs, prompts of 208 + 96k tokens (whole
// 16-token blocks, each turn's prefix the previous turn's prompt).
func replayTrace(sessions, turns int, startMs, thinkMs int64) *Trace {
	t := &Trace{Name: "replay", Header: traces.Header{Format: traces.Format, Version: traces.Version, BlockSize: 16}}
	type rec struct {
		at int64
		r  *traces.Request
	}
	var all []rec
	for j := range sessions {
		var chain []uint64
		for k := range turns {
			p := 208 + 96*k
			for len(chain) < p/16 {
				chain = append(chain, uint64(j+1)<<32|uint64(len(chain)+1))
			}
			r := &traces.Request{
				ArrivalMs: int64(j)*startMs + int64(k)*10, Session: string(rune('a' + j)), Turn: k,
				PromptTokens: p, OutputTokens: 16, CachedTokens: -1, Replica: -1,
				HashIDs: append([]uint64(nil), chain[:p/16]...),
			}
			if k > 0 {
				r.ThinkMs = thinkMs
			}
			all = append(all, rec{r.ArrivalMs, r})
		}
	}
	// Arrival order.
	for i := 1; i < len(all); i++ {
		for k := i; k > 0 && all[k].at < all[k-1].at; k-- {
			all[k], all[k-1] = all[k-1], all[k]
		}
	}
	for _, a := range all {
		t.Requests = append(t.Requests, a.r)
	}
	return t
}

func replayRecords(t *testing.T, buf *bytes.Buffer) map[string][]RequestRecord {
	t.Helper()
	out := map[string][]RequestRecord{}
	sc := bufio.NewScanner(buf)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec RequestRecord
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		out[rec.Session] = append(out[rec.Session], rec)
	}
	for _, rs := range out {
		for i := 1; i < len(rs); i++ {
			for k := i; k > 0 && rs[k].Turn < rs[k-1].Turn; k-- {
				rs[k], rs[k-1] = rs[k-1], rs[k]
			}
		}
	}
	return out
}

// TestSessionReplayPacesTurns: a session replay starts each session at its
// recorded arrival (divided by the speed-up) and sends each later turn
// after the previous answer plus its think time, whatever the recorded
// gap; the open-loop replay sends at the recorded times. Two runs are
// byte-identical.
func TestSessionReplayPacesTurns(t *testing.T) {
	f := mustDefaultFarm(t)
	tr := replayTrace(3, 4, 2000, 500)
	for _, speed := range []float64{1, 2} {
		var buf bytes.Buffer
		e := Experiment{Farm: f, Strategies: []string{"affinity"}, Trace: tr, SessionReplay: true, Speed: speed, Seed: 1, Requests: &buf}
		rep, err := Run(context.Background(), e)
		if err != nil {
			t.Fatal(err)
		}
		if row := rep.Rows[0]; row.Finished != 12 || row.Unfinished != 0 || row.Sessions != 3 {
			t.Fatalf("speed %g: finished %d, unfinished %d, sessions %d; want 12, 0, 3", speed, row.Finished, row.Unfinished, row.Sessions)
		}
		recs := replayRecords(t, &buf)
		for j, s := range []string{"a", "b", "c"} {
			rs := recs[s]
			if len(rs) != 4 {
				t.Fatalf("session %s: %d records", s, len(rs))
			}
			if want := float64(j) * 2 / speed; math.Abs(float64(rs[0].ArrivalS)-want) > 1e-6 {
				t.Errorf("speed %g: session %s starts at %.3f s, want its recorded %.3f s", speed, s, float64(rs[0].ArrivalS), want)
			}
			for k := 1; k < 4; k++ {
				if gap := float64(rs[k].ArrivalS - rs[k-1].FinishS); gap < 0.5/speed-1e-6 {
					t.Errorf("speed %g: session %s turn %d sent %.3f s after the previous answer, want at least its think time %.3f s",
						speed, s, k, gap, 0.5/speed)
				}
			}
		}
		again, err := Run(context.Background(), Experiment{Farm: f, Strategies: []string{"affinity"}, Trace: tr, SessionReplay: true, Speed: speed, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		a, _ := json.Marshal(rep)
		b, _ := json.Marshal(again)
		if !bytes.Equal(a, b) {
			t.Errorf("speed %g: two runs differ", speed)
		}
	}
	// The open loop sends turn k at its recorded 10 ms step, before the
	// previous answer.
	var buf bytes.Buffer
	if _, err := Run(context.Background(), Experiment{Farm: f, Strategies: []string{"affinity"}, Trace: tr, Seed: 1, Requests: &buf}); err != nil {
		t.Fatal(err)
	}
	if rs := replayRecords(t, &buf)["a"]; len(rs) != 4 || float64(rs[1].ArrivalS) > 0.011 {
		t.Errorf("open loop: session a's turn 1 sent at %v s, want its recorded 0.010 s", rs[1].ArrivalS)
	}
	if _, err := Run(context.Background(), Experiment{Farm: f, SessionReplay: true}); err == nil {
		t.Error("a session replay without a trace ran")
	}
}

// TestSessionReplayRouterLearnsEndsByIdle: as the proxy, the router of a
// session replay is not told that a conversation ended; a new one waiting
// for admission is admitted once the ended one has been quiet for the
// active window, not when its last answer ends.
func TestSessionReplayRouterLearnsEndsByIdle(t *testing.T) {
	f, err := ParseFarm([]byte(`model: Qwen/Qwen3-4B-Instruct-2507
gpu: H100 SXM
replicas: 1
vllm: {num_gpu_blocks: 40, max_num_seqs: 4, max_model_len: 624}
routing: {admission: kv, active_window: 5s}
`), "farm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// Session a: prompts 208, 304, 400 (+16 out): ~416 of the 624 tokens.
	// Session b starts at 1 s with 208 tokens at least (its expected
	// footprint is the typical one, ~416): it does not fit beside a.
	tr := replayTrace(2, 3, 1000, 100)
	var buf bytes.Buffer
	rep, err := Run(context.Background(), Experiment{Farm: f, Strategies: []string{"affinity"}, Trace: tr, SessionReplay: true, Seed: 1, Requests: &buf})
	if err != nil {
		t.Fatal(err)
	}
	if row := rep.Rows[0]; row.AdmissionWaits == 0 || row.Finished != 6 {
		t.Fatalf("admission waits %d, finished %d; want b to wait, then all 6 to finish", row.AdmissionWaits, row.Finished)
	}
	recs := replayRecords(t, &buf)
	a, b := recs["a"], recs["b"]
	if len(a) != 3 || len(b) != 3 {
		t.Fatalf("records a %d, b %d", len(a), len(b))
	}
	lastSeen := float64(a[2].ArrivalS)
	admitted := float64(b[0].ArrivalS + b[0].TTFBS)
	if admitted < lastSeen+5 {
		t.Errorf("b's first token at %.2f s, a last seen at %.2f s: b was admitted before a had been quiet for the 5 s active window", admitted, lastSeen)
	}
	if admitted > lastSeen+5+2 {
		t.Errorf("b's first token at %.2f s, a last seen at %.2f s: b waited far past the active window", admitted, lastSeen)
	}
}
