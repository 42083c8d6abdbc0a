package main

import (
	"strings"
	"testing"

	"github.com/lm-warden/warden/placement"
)

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		name      string
		epp, mine int
		eppScores []float64
		myScores  []float64
		want      verdict
	}{
		{"same pick", 1, 1, []float64{1, 2}, []float64{1, 2}, agree},
		{"both tied at the top", 0, 1, []float64{3, 3, 1}, []float64{2.5, 2.5, 1}, onTie},
		{"the EPP tied, the model strict", 0, 1, []float64{3, 3}, []float64{2, 3}, strict},
		{"the model tied, the EPP strict", 0, 1, []float64{3, 2}, []float64{3, 3}, strict},
		{"both strict", 0, 1, []float64{3, 2}, []float64{2, 3}, strict},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := classify(c.epp, c.mine, c.eppScores, c.myScores); got != c.want {
				t.Errorf("classify = %d, want %d", got, c.want)
			}
		})
	}
}

// TestEPPBlocks: two prompts whose EPP bytes agree on their first p bytes
// share exactly p/256 leading block ids, as the EPP's chained xxhash64 of
// 64-pseudo-token blocks does; the last partial block never equals a
// full one.
func TestEPPBlocks(t *testing.T) {
	sys := message{Role: "system", Content: strings.Repeat("rules ", 200)} // 6 + 1200 bytes
	for _, c := range []struct {
		name       string
		a, b       []message
		wantShared int
	}{
		{"diverge in the first user message", []message{sys, {"user", "task one"}}, []message{sys, {"user", "task two"}}, (6 + 1200 + 4 + 5) / 256},
		{"a later turn extends an earlier one", []message{sys, {"user", "task"}},
			[]message{sys, {"user", "task"}, {"assistant", strings.Repeat("x", 600)}}, (6 + 1200 + 4 + 4) / 256},
		{"the same prompt", []message{sys}, []message{sys}, 5},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := eppBlocks(eppBytes(c.a)), eppBlocks(eppBytes(c.b))
			n := 0
			for n < min(len(a), len(b)) && a[n] == b[n] {
				n++
			}
			if n != c.wantShared {
				t.Errorf("shared %d leading blocks, want %d", n, c.wantShared)
			}
		})
	}
	if got := len(eppBytes([]message{{"user", "abcde"}})); got != 12 {
		t.Errorf("eppBytes of 9 bytes: %d bytes, want 12 (zero-padded to 4)", got)
	}
}

func TestStateFromParts(t *testing.T) {
	caps := []replicaState{{KVCapacityTokens: 100}, {KVCapacityTokens: 100}, {KVCapacityTokens: 100}}
	for _, c := range []struct {
		name        string
		parts       [][3]float64
		gauges      []replicaState
		wantWaiting []int
	}{
		{"equal queues", [][3]float64{{1, 0.9, 0}, {1, 0.7, 0}, {1, 1, 0}}, caps, []int{0, 0, 0}},
		{"the gateway's counts give the scores", [][3]float64{{1, 0.9, 0}, {0.5, 0.7, 0}, {0, 1, 0}},
			[]replicaState{{Waiting: 3, KVCapacityTokens: 100}, {Waiting: 4, KVCapacityTokens: 100}, {Waiting: 5, KVCapacityTokens: 100}}, []int{3, 4, 5}},
		{"rebuilt counts", [][3]float64{{1, 0.9, 0}, {2.0 / 3, 0.7, 0}, {0, 1, 0}}, caps, []int{0, 1, 3}},
	} {
		t.Run(c.name, func(t *testing.T) {
			st, err := stateFromParts(c.parts, c.gauges)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range st {
				if s.Waiting != c.wantWaiting[i] || 1-s.KVUsage != c.parts[i][1] || s.KVCapacityTokens != 100 {
					t.Errorf("replica %d: %+v, want waiting %d, 1 - usage = %v, capacity 100", i, s, c.wantWaiting[i], c.parts[i][1])
				}
			}
		})
	}
	if _, err := stateFromParts([][3]float64{{0.123456789, 1, 0}, {0, 1, 0}}, caps[:2]); err == nil {
		t.Error("queue scores no small counts give: no error")
	}
}

func TestLogParts(t *testing.T) {
	log := `{"level":"info","msg":"EPP received request","x-request-id":"a"}
{"level":"debug","msg":"Calculated score","x-request-id":"a","plugin":"queue-scorer/queue-scorer","endpoint":"local/r0","score":1}
{"level":"debug","msg":"Calculated score","x-request-id":"a","plugin":"kv-cache-utilization-scorer/kv-cache-utilization-scorer","endpoint":"local/r0","score":0.75}
{"level":"debug","msg":"Calculated score","x-request-id":"a","plugin":"prefix-cache-scorer/prefix-cache-scorer","endpoint":"local/r0","score":0.5}
{"level":"debug","msg":"Calculated score","x-request-id":"b","plugin":"queue-scorer/queue-scorer","endpoint":"local/r0","score":1}
not json
`
	got, err := logParts(strings.NewReader(log), []string{"r0"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["a"][0] != [3]float64{1, 0.75, 0.5} {
		t.Errorf("logParts = %v, want request a only (b is incomplete): [[1 0.75 0.5]]", got)
	}
	bad := `{"msg":"Calculated score","x-request-id":"a","plugin":"queue-scorer","endpoint":"local/other","score":1}`
	if _, err := logParts(strings.NewReader(bad), []string{"r0"}); err == nil {
		t.Error("a score for an unknown endpoint: no error")
	}
}

// TestFollowPlacesHistoryWhereTheEPPDid: a session's second turn goes, in
// the model, where the EPP put its first (the prefix is there), whichever
// replica that was.
func TestFollowPlacesHistoryWhereTheEPPDid(t *testing.T) {
	w := workload{seed: 1, model: testModel, sessions: 1, turns: 2, systemBytes: 2000, taskBytes: 2000,
		toolMinBytes: 200, toolMaxBytes: 200, maxTokens: 16}
	c := w.conversations()[0]
	first := w.body(c)
	w.advance(c, "an answer")
	second := w.body(c)
	idle := []replicaState{{KVCapacityTokens: 16384}, {KVCapacityTokens: 16384}, {KVCapacityTokens: 16384}}
	for home := range idle {
		turns := []turnRecord{{Body: first, EPP: home, State: idle}, {Body: second, State: idle}}
		for _, v := range []view{eppView, proxyView} {
			reqs := make([]placement.Request, len(turns))
			for k, tr := range turns {
				q, err := request(testModel, tr.Body, v)
				if err != nil {
					t.Fatal(err)
				}
				reqs[k] = q
			}
			m, err := follow(turns, reqs, 1, 1)
			if err != nil {
				t.Fatal(err)
			}
			if m.replica != home {
				t.Errorf("%s: the first turn on replica %d, the second picked %d, want %d (scores %v)", v, home, m.replica, home, m.scores)
			}
		}
	}
}
