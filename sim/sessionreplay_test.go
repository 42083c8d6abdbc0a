package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"math"
	"testing"

	"github.com/lm-warden/warden/placement"
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

// replayFarm is one H100 replica whose 40 KV blocks (640 tokens) hold one
// conversation of replayTrace, not two, once the first has had three
// turns (prompts 208, 304, 400 + 16 out: 416 tokens): a second one then
// expects the typical footprint (over 224 tokens) and waits for admission
// while the first is held. routing is the farm's routing block.
func replayFarm(t *testing.T, routing string) *Farm {
	t.Helper()
	f, err := ParseFarm([]byte(`model: Qwen/Qwen3-4B-Instruct-2507
gpu: H100 SXM
replicas: 1
vllm: {num_gpu_blocks: 40, max_num_seqs: 4, max_model_len: 624}
scrape_interval: 100ms
routing: `+routing+`
`), "farm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// runReplay runs trace tr through affinity on f as a session replay and
// returns its row and its records by session, in turn order (a refused
// attempt before its retries).
func runReplay(t *testing.T, f *Farm, tr *Trace) (Row, map[string][]RequestRecord) {
	t.Helper()
	var buf bytes.Buffer
	rep, err := Run(context.Background(), Experiment{Farm: f, Strategies: []string{"affinity"}, Trace: tr, SessionReplay: true, Seed: 1, Requests: &buf})
	if err != nil {
		t.Fatal(err)
	}
	recs := replayRecords(t, &buf)
	for _, rs := range recs {
		for i := 1; i < len(rs); i++ {
			for k := i; k > 0 && rs[k].Turn == rs[k-1].Turn && rs[k].Attempt < rs[k-1].Attempt; k-- {
				rs[k], rs[k-1] = rs[k-1], rs[k]
			}
		}
	}
	return rep.Rows[0], recs
}

// firstTokenS is when record r's first token reached its client.
func firstTokenS(r RequestRecord) float64 { return float64(r.ArrivalS + r.TTFBS) }

// maxGapS is the longest think gap of session rs as its client left it:
// from one answer's end to the next turn's send.
func maxGapS(rs []RequestRecord) float64 {
	g := 0.0
	for k := 1; k < len(rs); k++ {
		g = max(g, float64(rs[k].ArrivalS-rs[k-1].FinishS))
	}
	return g
}

// TestSessionReplayReleasesAfterReturnTimeout: as the proxy, the router of
// a session replay learns when each request is sent and when it ends
// (Table.Start, Table.Finish), never that a conversation ended: one that
// has gone quiet stops holding KV headroom after its return timeout (RFC
// 6298 over its gaps, here under a second, so placement.MinHold) from its
// last answer's end, not after the active window (30 s here), and a new
// conversation waiting for admission is admitted then, at the next scrape
// (100 ms). The old replay, which never told the table of a request's end,
// held a for the whole active window: b's first token came after 30 s.
func TestSessionReplayReleasesAfterReturnTimeout(t *testing.T) {
	f := replayFarm(t, "{admission: kv, active_window: 30s}")
	// Session a: three turns 100 ms of thinking apart; b starts at 1 s.
	row, recs := runReplay(t, f, replayTrace(2, 3, 1000, 100))
	if row.AdmissionWaits != 1 || row.AdmissionRefused != 0 || row.Finished != 6 {
		t.Fatalf("admission waits %d, refused %d, finished %d; want b to wait once, then all 6 to finish", row.AdmissionWaits, row.AdmissionRefused, row.Finished)
	}
	a, b := recs["a"], recs["b"]
	if len(a) != 3 || len(b) != 3 {
		t.Fatalf("records a %d, b %d", len(a), len(b))
	}
	if g := maxGapS(a); g >= placement.MinHold.Seconds()/3 {
		t.Fatalf("a's gaps reach %.3f s: its return timeout is not MinHold, the test's premise", g)
	}
	lastEnd := float64(a[2].FinishS)
	admitted := firstTokenS(b[0])
	if admitted < lastEnd+placement.MinHold.Seconds() {
		t.Errorf("b's first token at %.2f s, a's last answer ended at %.2f s: b was admitted before a's return timeout (%s) had passed", admitted, lastEnd, placement.MinHold)
	}
	if admitted > lastEnd+placement.MinHold.Seconds()+0.5 {
		t.Errorf("b's first token at %.2f s, a's last answer ended at %.2f s: b waited past a's return timeout (%s) plus a scrape and its prefill (the old replay: past the 30 s active window)", admitted, lastEnd, placement.MinHold)
	}
}

// TestSessionReplayHoldsBetweenTurns: a conversation between its turns
// still holds its KV headroom (its prefix is cached for its return): a new
// conversation arriving during a's think time waits until a's last turn
// has ended and its return timeout passed, which the 3 s gaps make about
// three gaps at most (RFC 6298's first sample: SRTT + 4 x RTTVAR = 3 R),
// far below the 60 s active window. The old replay held a for the active
// window, and b, past its 30 s admission timeout, was refused.
func TestSessionReplayHoldsBetweenTurns(t *testing.T) {
	f := replayFarm(t, "{admission: kv, admission_timeout: 30s, active_window: 60s}")
	// Session a: four turns 3 s of thinking apart; b starts at 7 s, in a's
	// last gap.
	row, recs := runReplay(t, f, replayTrace(2, 4, 7000, 3000))
	if row.AdmissionWaits != 1 || row.AdmissionRefused != 0 || row.Finished != 8 {
		t.Fatalf("admission waits %d, refused %d, finished %d; want b to wait once, then all 8 to finish", row.AdmissionWaits, row.AdmissionRefused, row.Finished)
	}
	a, b := recs["a"], recs["b"]
	lastEnd := float64(a[3].FinishS)
	admitted := firstTokenS(b[0])
	if admitted < lastEnd+placement.MinHold.Seconds() {
		t.Errorf("b's first token at %.2f s, a's last answer ended at %.2f s: b took a's room during a's think time or before its return timeout", admitted, lastEnd)
	}
	if limit := lastEnd + 3*maxGapS(a) + 1; admitted > limit {
		t.Errorf("b's first token at %.2f s, after %.2f s: a was held past three of its gaps after its last answer (%.2f s)", admitted, limit, lastEnd)
	}
}

// TestSessionReplayRetriesRefused: a first turn refused after its
// admission wait (429/529 with Retry-After in the proxy) is sent again
// after placement.AdmissionRetryAfter, as the Anthropic and OpenAI SDKs
// do, at most sdkMaxRetries times; its TTFB counts from its first attempt,
// as the client's call sees it. Before, the session gave up at the first
// refusal.
func TestSessionReplayRetriesRefused(t *testing.T) {
	retryAfter := placement.AdmissionRetryAfter.Seconds()
	t.Run("admitted on a retry", func(t *testing.T) {
		// a's three turns, 1 s of thinking apart, end at about 2.2 s and
		// hold its room for about 2.5 s more; b, from 2.5 s, is refused
		// after its 0.5 s wait and admitted on its first retry, 5 s later.
		f := replayFarm(t, "{admission: kv, admission_timeout: 500ms, active_window: 30s}")
		row, recs := runReplay(t, f, replayTrace(2, 3, 2500, 1000))
		if row.AdmissionWaits != 1 || row.AdmissionRefused != 1 || row.AdmissionRetries != 1 || row.Finished != 6 || row.Unfinished != 0 {
			t.Fatalf("waits %d, refused %d, retries %d, finished %d, unfinished %d; want 1, 1, 1, 6, 0",
				row.AdmissionWaits, row.AdmissionRefused, row.AdmissionRetries, row.Finished, row.Unfinished)
		}
		b := recs["b"]
		if len(b) != 4 || b[0].Attempt != 0 || b[0].Finished || b[0].Replica != -1 || b[1].Attempt != 1 || !b[1].Finished {
			t.Fatalf("b's records %+v: want the refused attempt, then its retry and two more turns", b)
		}
		if b[1].ArrivalS != b[0].ArrivalS || float64(b[1].TTFBS) < 0.5+retryAfter {
			t.Errorf("retry sent (call begun) at %v s with TTFB %v s: want the first attempt's %v s and a TTFB past its wait and the %v s Retry-After",
				b[1].ArrivalS, b[1].TTFBS, b[0].ArrivalS, retryAfter)
		}
		if got, want := firstTokenS(b[1]), float64(b[0].ArrivalS)+0.5+retryAfter; got < want || got > want+0.5 {
			t.Errorf("b's first token at %.2f s, want about %.2f s (refused after 0.5 s, sent again %v s later)", got, want, retryAfter)
		}
	})
	t.Run("gives up after the SDK's retries", func(t *testing.T) {
		// a thinks 8 s between three turns, ends at about 16.2 s and holds
		// its room for about 20 s more (gaps of 8 s); b, from 17 s, is
		// refused three times and its session ends.
		f := replayFarm(t, "{admission: kv, admission_timeout: 500ms, active_window: 60s}")
		row, recs := runReplay(t, f, replayTrace(2, 3, 17000, 8000))
		if row.AdmissionWaits != sdkMaxRetries+1 || row.AdmissionRefused != sdkMaxRetries+1 || row.AdmissionRetries != sdkMaxRetries ||
			row.Finished != 3 || row.Unfinished != 1 {
			t.Fatalf("waits %d, refused %d, retries %d, finished %d, unfinished %d; want %d, %d, %d, 3, 1", row.AdmissionWaits, row.AdmissionRefused,
				row.AdmissionRetries, row.Finished, row.Unfinished, sdkMaxRetries+1, sdkMaxRetries+1, sdkMaxRetries)
		}
		b := recs["b"]
		if len(b) != sdkMaxRetries+1 {
			t.Fatalf("b has %d records, want its %d attempts", len(b), sdkMaxRetries+1)
		}
		for k, r := range b {
			if r.Attempt != k || r.Turn != 0 || r.Finished || r.ArrivalS != b[0].ArrivalS {
				t.Errorf("attempt %d: %+v", k, r)
			}
		}
		// The last refusal counts the whole call in its TTFB: three waits
		// and two Retry-Afters.
		last := float64(b[sdkMaxRetries].TTFBS)
		if want := 3*0.5 + 2*retryAfter; last < want || last > want+1 {
			t.Errorf("the give-up's TTFB %.2f s, want about %.2f s", last, want)
		}
	})
}
