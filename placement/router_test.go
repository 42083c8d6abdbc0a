package placement

import (
	"testing"
	"time"
)

// countingHeld is a HeldIndex that says every replica holds held blocks
// of any prompt and counts its calls.
type countingHeld struct {
	held  []int
	calls int
}

func (c *countingHeld) Held(_ []uint64, _ int, dst []int) ([]int, bool) {
	c.calls++
	return append(dst, c.held...), true
}

// TestRouterHooks: the Router feeds a policy what it says it reads and
// tells it what it says it follows, and nothing to one that says nothing:
// Prompt.Held only to a HeldReader (and only for that pick), first tokens
// and ends only to a Tracker, and the scrape interval of a Scraper.
func TestRouterHooks(t *testing.T) {
	snap := Snapshot{Replicas: []Replica{{ID: 0, Healthy: true}, {ID: 1, Healthy: true}}, MaxNumSeqs: 32}
	now := time.Unix(100, 0)
	req := func(id uint64) *Request {
		return &Request{Session: "s", PromptTokens: 64, Pinned: NoPin, ID: id,
			Prompt: Prompt{BlockTokens: 16, Blocks: []uint64{1, 2, 3, 4}}}
	}

	// Dynamo reads the held blocks and follows its requests: the replica
	// holding the prompt wins, and its active load is given back.
	d := NewDynamo(DynamoConfig{Seed: 1})
	held := &countingHeld{held: []int{0, 4}}
	r := NewRouter(d, nil)
	r.SetHeld(held)
	if !r.ReadsHeld() || !r.Tracks() || r.ScrapeInterval() != 0 {
		t.Fatalf("dynamo's router: reads %v tracks %v interval %v", r.ReadsHeld(), r.Tracks(), r.ScrapeInterval())
	}
	q := req(7)
	dec, err := r.Pick(q, &snap, now)
	if err != nil || dec.Replica != 1 || held.calls != 1 {
		t.Fatalf("dynamo picked %+v (%v) after %d calls, want replica 1 where the prompt is held", dec, err, held.calls)
	}
	if q.Prompt.Held != nil {
		t.Error("Prompt.Held outlives the pick (the router reuses its buffer)")
	}
	if len(d.active) != 1 {
		t.Fatalf("dynamo follows %d requests, want 1", len(d.active))
	}
	r.FirstToken(q, dec.Replica, now)
	r.Finished(q, dec.Replica, now)
	if len(d.active) != 0 || d.worker(1).prefillTokens != 0 || len(d.worker(1).blocks) != 0 {
		t.Errorf("after its end dynamo still holds %d requests, %d prefill tokens, %d blocks on replica 1",
			len(d.active), d.worker(1).prefillTokens, len(d.worker(1).blocks))
	}

	// Affinity without prefix held reads nothing: the index is not asked.
	held.calls = 0
	a := NewRouter(NewAffinity(Config{}), nil)
	a.SetHeld(held)
	if _, err := a.Pick(req(8), &snap, now); err != nil || held.calls != 0 || a.ReadsHeld() || a.Tracks() {
		t.Errorf("plain affinity: err %v, index asked %d times, reads %v, tracks %v", err, held.calls, a.ReadsHeld(), a.Tracks())
	}
	if NewRouter(NewLLMD(LLMDConfig{}), nil).ScrapeInterval() != llmdScrape {
		t.Error("llm-d's scrape interval does not reach the router")
	}
}

// TestRouterTables: a policy with a table of its own keeps it; one without
// gets the observer table, which records first homes and no footprints;
// Ended finishes turns with TurnEnds and records footprints without, for
// a policy that reads them; WithTable hands a table over.
func TestRouterTables(t *testing.T) {
	snap := Snapshot{Replicas: []Replica{{ID: 0, Healthy: true}, {ID: 1, Healthy: true}}, MaxNumSeqs: 32}
	now := time.Unix(100, 0)
	pick := func(r *Router, session string) int {
		t.Helper()
		d, err := r.Pick(&Request{Session: session, PromptTokens: 100, Pinned: NoPin}, &snap, now)
		if err != nil {
			t.Fatal(err)
		}
		return d.Replica
	}

	obs := NewTableWindow(0, 0, 0)
	h := NewRouter(&Hash{}, obs)
	if h.Table() != obs || !h.Observer() || h.KeepsHomes() || !h.Traits().Has(TraitSticky) {
		t.Fatalf("hash's router: table %p observer %v keeps %v traits %v", h.Table(), h.Observer(), h.KeepsHomes(), h.Traits())
	}
	first := pick(h, "x")
	if home, fst, ok := h.Lookup("x", now); !ok || home != first || fst != first {
		t.Errorf("observer table: %d %d %v, want the first pick %d", home, fst, ok, first)
	}
	h.TurnEnds = true
	h.Sent("x", now)
	h.Ended("x", 5000, now)
	if c := obs.Counters(); c[first].Footprint != 0 {
		t.Errorf("the observer table recorded a footprint %d", c[first].Footprint)
	}

	kv := NewRouter(NewAffinity(Config{Balance: BalanceKV}), obs)
	if kv.Observer() || !kv.KeepsHomes() || kv.Table() == obs || !kv.Traits().Has(TraitKV) {
		t.Fatalf("affinity's router took the observer table or lost its traits")
	}
	home := pick(kv, "y")
	kv.Ended("y", 3000, now) // no TurnEnds: the footprint is recorded
	if c := kv.Table().Counters(); c[home].Footprint != 3000 || c[home].Held != 1 {
		t.Errorf("without turn ends: footprint %d held %d, want 3000 and 1 (held while active)", c[home].Footprint, c[home].Held)
	}
	plain := NewRouter(NewAffinity(Config{}), nil)
	home = pick(plain, "z")
	plain.Ended("z", 3000, now) // affinity without KV options reads no footprint
	if c := plain.Table().Counters(); c[home].Footprint == 3000 {
		t.Error("a footprint recorded for a policy that reads none")
	}
	off := NewRouter(NewAffinity(Config{Disabled: true}), obs)
	if !off.Observer() || off.Traits() != 0 {
		t.Errorf("affinity switched off: observer %v traits %v, want the observer table and no traits", off.Observer(), off.Traits())
	}

	// A reload hands the table over: the same homes, the same policy.
	next := kv.WithTable(kv.Table())
	if h, ok := next.Table().Home("y", now); !ok || next.Table() != kv.Table() || next.Policy() == kv.Policy() {
		t.Errorf("hand-over: home %d %v, same table %v, new policy %v", h, ok, next.Table() == kv.Table(), next.Policy() != kv.Policy())
	}
	if !next.Traits().Has(TraitKV) {
		t.Error("the handed-over policy lost its configuration")
	}
}
