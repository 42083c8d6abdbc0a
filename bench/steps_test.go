package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/traces"
)

// runLogged runs cfg against a fake farm of two engines whose answers
// take about 100 ms, and returns the result and the --requests records.
func runLogged(t *testing.T, cfg Config) (*Result, []sim.RequestRecord) {
	t.Helper()
	f := newFakeServer(t, 2)
	f.TTFT = 5 * time.Millisecond
	f.TokenDelay = 12 * time.Millisecond
	cfg.Target = f.URL()
	cfg.Workload = traces.Workload{SystemPromptTokens: 64, FirstMessageTokens: 80, Turns: 3,
		NewTokensPerTurn: 20, MaxOutputTokens: 8, OutputTokens: traces.OutputMax}
	cfg.Seed, cfg.IgnoreEOS, cfg.SampleInterval = 7, true, 20*time.Millisecond
	var log bytes.Buffer
	cfg.Requests = &log
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var recs []sim.RequestRecord
	dec := json.NewDecoder(&log)
	for dec.More() {
		var r sim.RequestRecord
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("--requests line %d: %v", len(recs)+1, err)
		}
		recs = append(recs, r)
	}
	if len(recs) == 0 {
		t.Fatal("no request records")
	}
	var sent int64
	for _, st := range res.Steps {
		sent += st.Sent
	}
	if int64(len(recs)) != sent {
		t.Errorf("%d records for %d requests sent", len(recs), sent)
	}
	return res, recs
}

// bySession groups records by session, in arrival order.
func bySession(recs []sim.RequestRecord) map[string][]sim.RequestRecord {
	out := map[string][]sim.RequestRecord{}
	for _, r := range recs {
		out[r.Session] = append(out[r.Session], r)
	}
	for _, rs := range out {
		slices.SortFunc(rs, func(a, b sim.RequestRecord) int { return int(1e6 * (a.ArrivalS - b.ArrivalS)) })
	}
	return out
}

// TestStepsCarryOnOrStartFresh: carried on (the default, as warden sim
// and the published benchmark run), a step's end cuts nothing, and
// requests in flight then finish in the next step; with FreshSteps every
// step's end cuts them and ends the clients, so no session counts in two
// steps.
func TestStepsCarryOnOrStartFresh(t *testing.T) {
	for _, fresh := range []bool{false, true} {
		name := map[bool]string{false: "carried on", true: "fresh"}[fresh]
		t.Run(name, func(t *testing.T) {
			res, recs := runLogged(t, Config{Sessions: []int{2, 4}, Step: 600 * time.Millisecond, FreshSteps: fresh})
			boundary := res.Steps[0].End.Sub(res.Steps[0].Start).Seconds()
			spanning, twoSteps := 0, 0
			for id, rs := range bySession(recs) {
				if rs[0].Sessions != rs[len(rs)-1].Sessions {
					twoSteps++
				}
				for k, r := range rs {
					if r.Turn != k {
						t.Errorf("session %s: record %d is turn %d", id, k, r.Turn)
					}
					if r.Replica != -1 || r.Strategy != DefaultLabel {
						t.Errorf("session %s turn %d: replica %d strategy %q, want -1 (unknown to a client) and %q", id, r.Turn, r.Replica, r.Strategy, DefaultLabel)
					}
					if r.Finished && !(r.TTFBS > 0 && r.FinishS > r.ArrivalS+r.TTFBS-1e-9) {
						t.Errorf("session %s turn %d: arrival %v ttfb %v finish %v", id, r.Turn, r.ArrivalS, r.TTFBS, r.FinishS)
					}
					if r.Finished && float64(r.ArrivalS) < boundary && float64(r.FinishS) > boundary {
						spanning++
					}
				}
			}
			if fresh {
				// Every client ends with its step: no session counts in two.
				if twoSteps > 0 {
					t.Errorf("fresh steps: %d sessions count in two steps, want none", twoSteps)
				}
				return
			}
			if res.Steps[0].Cut != 0 {
				t.Errorf("carried on: the first step's end cut %d requests, want none", res.Steps[0].Cut)
			}
			if spanning == 0 {
				t.Error("carried on: no request in flight at the first step's end went on to finish")
			}
		})
	}
}

// TestFewerSessionsRetireClients: carried on from 3 sessions to 1, the
// clients beyond the first end with their sessions, so the sessions that
// begin in the second step are one client's, one after another.
func TestFewerSessionsRetireClients(t *testing.T) {
	res, recs := runLogged(t, Config{Sessions: []int{3, 1}, Step: 700 * time.Millisecond})
	second := res.Steps[1].Start.Sub(res.Steps[0].Start).Seconds()
	type span struct{ start, end float64 }
	var later []span
	for _, rs := range bySession(recs) {
		if float64(rs[0].ArrivalS) < second || rs[0].Turn != 0 {
			continue
		}
		last := rs[len(rs)-1]
		end := float64(last.FinishS)
		if !last.Finished {
			end = 1e9 // cut at the run's end: nothing starts after it
		}
		later = append(later, span{float64(rs[0].ArrivalS), end})
	}
	if len(later) == 0 {
		t.Fatal("no session began in the 1-session step")
	}
	slices.SortFunc(later, func(a, b span) int { return int(1e6 * (a.start - b.start)) })
	for i := 1; i < len(later); i++ {
		if later[i].start < later[i-1].end {
			t.Errorf("sessions of the 1-session step overlap: one from %.3f to %.3f s, the next from %.3f s", later[i-1].start, later[i-1].end, later[i].start)
		}
	}
}
