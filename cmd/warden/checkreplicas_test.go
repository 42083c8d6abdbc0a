package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lm-warden/warden/kvevents"
	"github.com/lm-warden/warden/live"
)

func fp(v float64) *float64 { return &v }
func ip(v int) *int         { return &v }

// statusOf is a model "m" of two replicas with hit % hits, each followed
// by KV events (kv nil: no kv_events).
func statusOf(hits [2]float64, kv [2]*kvevents.ReplicaStatus) live.StatusReport {
	var reps []live.ReplicaStatus
	for i := range 2 {
		reps = append(reps, live.ReplicaStatus{ID: i, Requests: 10, PrefixHitPct: fp(hits[i]), KVCapacityTokens: ip(100_000), KVEvents: kv[i]})
	}
	return live.StatusReport{Models: []live.Status{{Model: "m", Replicas: reps}}}
}

func events(batches int64, miss kvevents.MissTokens) *kvevents.ReplicaStatus {
	return &kvevents.ReplicaStatus{Connected: true, Complete: true, Batches: batches, BlocksHeld: 500, Miss: miss}
}

func TestCheckReplicas(t *testing.T) {
	healthy := [2]*kvevents.ReplicaStatus{
		events(40, kvevents.MissTokens{Cold: 9000, Elsewhere: 2000}),
		events(40, kvevents.MissTokens{Cold: 8000, Elsewhere: 3000}),
	}
	cases := []struct {
		name    string
		st      live.StatusReport
		farmKV  int
		drifted bool
		want    string // in replica 0's findings ("" : none)
	}{
		{"agrees", statusOf([2]float64{78, 83}, healthy), 100_000, false, ""},
		{"hit drifted", statusOf([2]float64{40, 83}, healthy), 0, true, "hit 40.0% vs 80.0% predicted"},
		{"smaller cache", statusOf([2]float64{78, 83}, healthy), 200_000, true, "a smaller cache than configured: vLLM reports 100000 tokens, the farm spec 200000"},
		{"changed format", statusOf([2]float64{78, 83}, [2]*kvevents.ReplicaStatus{
			{Connected: true, Batches: 0, Undecodable: 7, BadPayload: "kv event batch: byte 0: want an array, got a string"}, healthy[1]}), 0, true,
			"a changed event format: 7 batches undecodable"},
		{"no events", statusOf([2]float64{78, 83}, [2]*kvevents.ReplicaStatus{events(0, kvevents.MissTokens{}), healthy[1]}), 0, true,
			"no KV events though the replica served requests"},
		{"hash seed", statusOf([2]float64{78, 83}, [2]*kvevents.ReplicaStatus{
			events(40, kvevents.MissTokens{Cold: 9000}), events(40, kvevents.MissTokens{Cold: 9000})}), 0, false,
			"no block was ever computed on two replicas: a changed or unset hash seed"},
		{"evictions", statusOf([2]float64{50, 83}, [2]*kvevents.ReplicaStatus{
			events(40, kvevents.MissTokens{Cold: 9000, Evicted: 6000, Elsewhere: 100}), healthy[1]}), 0, true,
			"evictions: blocks recomputed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rows, err := checkReplicas(c.st, "m", 80, 0.1, c.farmKV)
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join(rows[0].Findings, "; ")
			if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
				t.Errorf("findings %q, want %q", got, c.want)
			}
			if rows[0].Drifted != c.drifted {
				t.Errorf("drifted %v, want %v", rows[0].Drifted, c.drifted)
			}
		})
	}
	if _, err := checkReplicas(statusOf([2]float64{}, healthy), "other", 80, 0.1, 0); err == nil || !strings.Contains(err.Error(), `no model "other" (the proxy serves m)`) {
		t.Errorf("unknown model: %v", err)
	}
}

// TestCheckStatusCommand runs `warden check --status` against a real HTTP
// server serving a proxy's status: exit ErrDrift and a table naming why.
func TestCheckStatusCommand(t *testing.T) {
	st := statusOf([2]float64{40, 83}, [2]*kvevents.ReplicaStatus{
		events(40, kvevents.MissTokens{Cold: 9000, Evicted: 6000}), events(40, kvevents.MissTokens{Cold: 900, Elsewhere: 300})})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(st)
	}))
	t.Cleanup(srv.Close)
	pred := filepath.Join(t.TempDir(), "sim.json")
	if err := os.WriteFile(pred, []byte(`{"farm":"f","rows":[{"strategy":"affinity","sessions":8,"prefix_hit_pct":80}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	o := &checkOptions{Predicted: pred, Tolerance: "10%", Status: srv.URL + "/api/status"}
	o.Model = "m"
	err := runCheck(context.Background(), o, &out)
	if !errors.Is(err, ErrDrift) {
		t.Fatalf("err %v, want ErrDrift\n%s", err, out.String())
	}
	for _, want := range []string{
		"replica  hit % predicted  hit % vLLM  blocks held  computed cold/evicted/elsewhere  verdict",
		"0        80.0             40.0        500          9000/6000/0                      DRIFT: hit 40.0% vs 80.0% predicted; evictions",
		"1        80.0             83.0        500          900/0/300                        ok",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
