package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/traces"
)

// TestAPIServerWorksOnOneRequestAtATime: four conversations start at once
// on two replicas, with an API server that takes 1 s a request and a
// prompt that prefills in well under that. vLLM's server templates and
// tokenises one request at a time (apiserver.go), so the k-th first token
// comes after (k+1) s of its server's work, not all after 1 s: behind
// vLLM's own front end with one API server (least-loaded, api_server_count
// 1) all four queue on it, 1, 2, 3 and 4 s; with the router in front of
// two vLLM servers (affinity), each has its own, two conversations each:
// 1, 1, 2 and 2 s.
func TestAPIServerWorksOnOneRequestAtATime(t *testing.T) {
	farm, w := slowAPIServer(t, 1)
	for _, tc := range []struct {
		strategy string
		want     []float64 // the API server work before each first token, s
	}{
		{placement.StrategyLeastLoaded, []float64{1, 2, 3, 4}},
		{placement.StrategyAffinity, []float64{1, 1, 2, 2}},
	} {
		t.Run(tc.strategy, func(t *testing.T) {
			var buf bytes.Buffer
			e := Experiment{Farm: farm, Strategies: []string{tc.strategy}, Workload: w, Sessions: []int{4}, Duration: 20 * time.Second, Seed: 1, Requests: &buf}
			if _, err := Run(context.Background(), e); err != nil {
				t.Fatal(err)
			}
			var ttfbs []float64
			sc := bufio.NewScanner(&buf)
			for sc.Scan() {
				var rec RequestRecord
				if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
					t.Fatal(err)
				}
				if rec.ArrivalS == 0 {
					ttfbs = append(ttfbs, float64(rec.TTFBS))
				}
			}
			slices.Sort(ttfbs)
			if len(ttfbs) != len(tc.want) {
				t.Fatalf("%d requests sent at 0 s, want %d", len(ttfbs), len(tc.want))
			}
			for k, want := range tc.want {
				// After its server's work: its queue and a short prefill.
				if got := ttfbs[k]; math.IsNaN(got) || got < want || got > want+0.3 {
					t.Errorf("first tokens at %.3f s, want %v s plus at most 0.3 s each", ttfbs, tc.want)
					break
				}
			}
		})
	}
}

// TestCutWhileAtTheAPIServer: a step that ends while requests are still
// queued at their replicas' API servers (routed, counted in flight, not
// yet at the engine) cuts them as it cuts waiting ones: each has one
// unfinished record, counted censored with the wait it had, and the table
// counts every cut request unfinished.
func TestCutWhileAtTheAPIServer(t *testing.T) {
	farm, w := slowAPIServer(t, 0)
	var buf bytes.Buffer
	e := Experiment{Farm: farm, Strategies: []string{placement.StrategyAffinity}, Workload: w, Sessions: []int{8}, Duration: 2500 * time.Millisecond, Seed: 1, Requests: &buf}
	rep, err := Run(context.Background(), e)
	if err != nil {
		t.Fatal(err)
	}
	var records, unfinished, censored int
	sc := bufio.NewScanner(&buf)
	for sc.Scan() {
		var rec RequestRecord
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		records++
		if !rec.Finished {
			unfinished++
			if (!rec.Censored && math.IsNaN(float64(rec.TTFBS))) || rec.Replica < 0 {
				t.Errorf("cut request %+v: want a first token or a censored wait, on its replica", rec)
			}
		}
		if rec.Censored {
			censored++
		}
	}
	// 8 conversations, 4 per replica: two through each server by 2.5 s
	// (answers of 256 tokens take longer), two still queued there.
	if records != 8 || censored != 4 {
		t.Errorf("%d records, %d censored; want 8 sent at 0 s, 4 cut at the API servers", records, censored)
	}
	if got := int(rep.Rows[0].Unfinished); got != unfinished {
		t.Errorf("table counts %d unfinished, records %d", got, unfinished)
	}
}

// slowAPIServer is two replicas of the default farm (apiServers API servers
// behind vLLM's DP front end, 0: the DP size) and short one-turn sessions
// whose API server work is 1 s a request, with no network time.
func slowAPIServer(t *testing.T, apiServers int) (*Farm, traces.Workload) {
	t.Helper()
	spec := mustDefaultFarm(t).Spec
	spec.Replicas = 2
	spec.VLLM.APIServerCount = apiServers
	farm, err := Resolve(spec)
	if err != nil {
		t.Fatal(err)
	}
	w := traces.DefaultWorkload()
	w.SystemPromptTokens, w.FirstMessageTokens, w.Turns = 0, 200, 1
	w.NetworkRTT, w.APIServerTime, w.APIServerPerKToken = 0, time.Second, 0
	return farm, w
}
