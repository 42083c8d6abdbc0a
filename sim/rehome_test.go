package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"
)

// TestRehomeVariant: on the built-in farm at 24 sessions, where homes
// evict their conversations between turns, "re-home when cold" moves
// conversations (stayed % below plain affinity's 100) from what the block
// pool served each request (the cached tokens vLLM would report), runs
// are byte-identical for a seed, and plain affinity is unchanged by it.
func TestRehomeVariant(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates 3 minutes of a loaded farm twice")
	}
	f := mustDefaultFarm(t)
	run := func(strategies ...string) []byte {
		rep, err := Run(context.Background(), Experiment{Farm: f, Strategies: strategies, Sessions: []int{24}, Duration: 3 * time.Minute, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(rep)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var rep Report
	a := run("affinity", "affinity+rehome")
	if err := json.Unmarshal(a, &rep); err != nil {
		t.Fatal(err)
	}
	plain, cold := rep.Rows[0], rep.Rows[1]
	if plain.StayedPct != 100 {
		t.Errorf("plain affinity stayed %v %%, want 100", plain.StayedPct)
	}
	if !(cold.StayedPct < 100) {
		t.Errorf("affinity (rehome) stayed %v %%: no conversation was re-homed", cold.StayedPct)
	}
	if b := run("affinity", "affinity+rehome"); !bytes.Equal(a, b) {
		t.Error("two runs with the same seed differ")
	}
	var alone Report
	if err := json.Unmarshal(run("affinity"), &alone); err != nil {
		t.Fatal(err)
	}
	x, _ := json.Marshal(alone.Rows[0])
	y, _ := json.Marshal(plain)
	if !bytes.Equal(x, y) {
		t.Error("plain affinity's row changed when run beside affinity (rehome)")
	}
}
