package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/traces"
)

// TestPeersRunInSim: every peer's router of the registry runs in the
// simulator (a short closed loop on the built-in farm), finishes requests,
// gives only the reasons its registry entry lists, and gives the same
// result twice for the same seed.
func TestPeersRunInSim(t *testing.T) {
	f := mustDefaultFarm(t)
	peers := placement.PeerNames()
	if len(peers) == 0 {
		t.Fatal("the registry lists no peer")
	}
	run := func() ([]byte, []byte) {
		var reqs bytes.Buffer
		rep, err := Run(context.Background(), Experiment{Farm: f, Strategies: peers, Sessions: []int{8}, Duration: time.Minute, Seed: 3, Requests: &reqs})
		if err != nil {
			t.Fatal(err)
		}
		out, err := json.Marshal(rep)
		if err != nil {
			t.Fatal(err)
		}
		for _, row := range rep.Rows {
			if row.Finished == 0 {
				t.Errorf("%s: no request finished", row.Strategy)
			}
		}
		return out, reqs.Bytes()
	}
	a, reqs := run()
	if b, _ := run(); !bytes.Equal(a, b) {
		t.Error("two runs with the same seed differ")
	}
	sc := bufio.NewScanner(bytes.NewReader(reqs))
	for sc.Scan() {
		var r RequestRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		st, ok := placement.LookupStrategy(r.Strategy)
		if !ok {
			t.Fatalf("record of strategy %q, not a registered name", r.Strategy)
		}
		if r.Reason == "" {
			continue // rejected before routing
		}
		reason, err := placement.ParseReason(r.Reason)
		if err != nil || !slices.Contains(st.Reasons, reason) {
			t.Errorf("%s gave reason %q, not in its registry entry %v", r.Strategy, r.Reason, st.Reasons)
		}
	}
}

// TestPeerScrapeInterval: a policy that reads vLLM's gauges at its own
// interval (llm-d: 50 ms) sees them refreshed at it, not at the farm's
// scrape_interval; the others at the farm's.
func TestPeerScrapeInterval(t *testing.T) {
	f := mustDefaultFarm(t)
	for _, tt := range []struct {
		strategy string
		perSec   uint64 // snapshot refreshes per simulated second, at least
	}{
		{placement.PeerLLMD, 20},
		{placement.StrategyAffinity, 1},
	} {
		_, r, err := runStrategy(context.Background(), mustWithDefaults(t, Experiment{Farm: f, Sessions: []int{4}, Duration: 10 * time.Second, Seed: 1}), tt.strategy, nil)
		if err != nil {
			t.Fatal(err)
		}
		secs := uint64(r.now / usPerSec)
		if got := r.snap.Generation; got < tt.perSec*secs || got > (tt.perSec+1)*secs+2 {
			t.Errorf("%s: %d refreshes in %d s, want about %d a second", tt.strategy, got, secs, tt.perSec)
		}
	}
}

// peerRouter reports whether strategy is a peer's router (the suite runs
// them on fewer cases than the product's strategies).
func peerRouter(strategy string) bool {
	st, _ := placement.LookupStrategy(strategy)
	return st.Peer
}

func mustWithDefaults(t *testing.T, e Experiment) Experiment {
	t.Helper()
	e, err := e.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestHeldIndexMatchesPools: the run's index of which replicas hold each
// hash answers as walking each replica's pool does, for the prompts of
// the sessions the run served (they are held, partly evicted or gone) and
// the ones it did not.
func TestHeldIndexMatchesPools(t *testing.T) {
	f := mustDefaultFarm(t)
	e := mustWithDefaults(t, Experiment{Farm: f, Sessions: []int{24}, Duration: 3 * time.Minute, Seed: 1})
	_, r, err := runStrategy(context.Background(), e, placement.PeerDynamo, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.heldIdx == nil {
		t.Fatal("dynamo's run on 4 replicas keeps no held index")
	}
	g := traces.NewGenerator(e.Workload, r.cfg.blockSize, e.Seed)
	checked, nonzero := 0, 0
	for range 60 {
		s, _ := g.NextSession()
		for _, turn := range s.Turns {
			got := r.heldIdx.leading(turn.HashIDs, len(r.reps), nil)
			for i, rep := range r.reps {
				if want := heldWalk(rep.pool, turn.HashIDs); got[i] != want {
					t.Fatalf("session %s turn %d replica %d: index %d, pool %d", s.ID, turn.Turn, i, got[i], want)
				}
				if got[i] > 0 {
					nonzero++
				}
			}
			checked++
		}
	}
	if nonzero == 0 {
		t.Fatalf("%d prompts checked, none held anywhere: the check proves nothing", checked)
	}
}
