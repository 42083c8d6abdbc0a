package placement

import (
	"testing"
	"time"
)

// TestObserveHits checks the per-conversation bookkeeping of observed hits
// and the cold-at-home rule, turn by turn.
func TestObserveHits(t *testing.T) {
	type turn struct {
		replica, prompt, cached, answer int
		wantCold                        bool
	}
	tests := []struct {
		name       string
		turns      []turn
		wantAsked  int64
		wantCached int64
	}{
		{"first turn never cold", []turn{{0, 5000, 0, 100, false}}, 5000, 0},
		{"warm home stays warm", []turn{{0, 1000, 0, 100, false}, {0, 2000, 1088, 100, false}}, 3000, 1088},
		{"flushed home is cold", []turn{{0, 1000, 0, 100, false}, {0, 2000, 16, 100, true}}, 3000, 16},
		{"exactly a fifth is not cold", []turn{{0, 1000, 0, 0, false}, {0, 2000, 200, 0, false}}, 3000, 200},
		{"just under a fifth is cold", []turn{{0, 1000, 0, 0, false}, {0, 2000, 199, 0, true}}, 3000, 199},
		{"expected is the smaller of had and prompt", []turn{{0, 10000, 0, 0, false}, {0, 1000, 210, 0, false}}, 11000, 210},
		{"small prefix is never cold", []turn{{0, 200, 0, 0, false}, {0, 300, 0, 0, false}}, 500, 0},
		{"warm turn clears cold", []turn{{0, 1000, 0, 0, false}, {0, 2000, 0, 0, true}, {0, 3000, 1984, 0, false}}, 6000, 1984},
		{"unknown cached keeps the mark and counts nothing", []turn{{0, 1000, 0, 0, false}, {0, 2000, 0, 0, true}, {0, 3000, -1, 0, true}}, 3000, 0},
		{"a spill is not judged nor counted", []turn{{0, 1000, 0, 0, false}, {1, 2000, 0, 0, false}, {0, 3000, 1000, 0, false}}, 4000, 1000},
		{"cached above the prompt is capped", []turn{{0, 1000, 5000, 0, false}}, 1000, 1000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := NewTableWindow(0, 0, 0)
			tb.Assign("s", 0, time.Unix(0, 0))
			for k, tu := range tt.turns {
				if !tb.ObserveHits("s", tu.replica, tu.prompt, tu.cached, tu.answer) {
					t.Fatalf("turn %d: ObserveHits does not know the session", k)
				}
				if _, _, cold, _ := tb.Hits("s"); cold != tu.wantCold {
					t.Errorf("turn %d: cold %v, want %v", k, cold, tu.wantCold)
				}
			}
			asked, cached, _, ok := tb.Hits("s")
			if !ok || asked != tt.wantAsked || cached != tt.wantCached {
				t.Errorf("Hits = %d asked, %d cached (ok %v), want %d, %d", asked, cached, ok, tt.wantAsked, tt.wantCached)
			}
			c := tb.Counters()[0]
			if c.AskedTokens != tt.wantAsked || c.CachedTokens != tt.wantCached {
				t.Errorf("replica 0 counters: %d asked, %d cached, want %d, %d", c.AskedTokens, c.CachedTokens, tt.wantAsked, tt.wantCached)
			}
		})
	}
}

func TestObserveHitsUnknownSession(t *testing.T) {
	tb := NewTableWindow(0, 0, 0)
	if tb.ObserveHits("nobody", 0, 100, 0, 0) {
		t.Error("ObserveHits reported a session the table does not know")
	}
	if _, _, _, ok := tb.Hits("nobody"); ok {
		t.Error("Hits reported a session the table does not know")
	}
}

// TestObserveHitsSlotReuse: a removed conversation's entry is reused by a
// new one, which must not inherit its cold mark.
func TestObserveHitsSlotReuse(t *testing.T) {
	tb := NewTableWindow(0, 0, 0)
	now := time.Unix(0, 0)
	tb.Assign("a", 0, now)
	tb.ObserveHits("a", 0, 1000, 0, 0)
	tb.ObserveHits("a", 0, 2000, 0, 0)
	if _, _, cold, _ := tb.Hits("a"); !cold {
		t.Fatal("a is not cold")
	}
	tb.Remove("a")
	tb.Assign("b", 0, now)
	tb.ObserveHits("b", 0, 3000, 0, 0)
	if asked, _, cold, _ := tb.Hits("b"); cold || asked != 3000 {
		t.Errorf("b inherited a's hits: asked %d, cold %v", asked, cold)
	}
}

// TestObserveHitsRenumber: a cold mark follows its replica through a
// change of the replica list.
func TestObserveHitsRenumber(t *testing.T) {
	tb := NewTableWindow(0, 0, 0)
	now := time.Unix(0, 0)
	tb.Assign("a", 1, now)
	tb.ObserveHits("a", 1, 1000, 0, 0)
	tb.ObserveHits("a", 1, 2000, 0, 0)
	tb.Renumber([]int{-1, 0})
	if _, _, cold, _ := tb.Hits("a"); !cold {
		t.Error("the cold mark was lost when replica 1 became 0")
	}
}

// TestRehomeKV: with balance kv, a cold conversation goes where a new
// one would, the most KV headroom, and never waits for admission.
func TestRehomeKV(t *testing.T) {
	for _, adm := range []Admission{AdmissionOff, AdmissionKV} {
		a := NewAffinity(Config{Rehome: RehomeCold, Balance: BalanceKV, Admission: adm})
		s := farm(3, 32)
		for i := range s.Replicas {
			s.Replicas[i].KVCapacityTokens = 10000
		}
		now := time.Unix(0, 0)
		if d := pick(t, a, Request{Session: "a", PromptTokens: 1000, Pinned: NoPin}, s, now); d.Replica != 0 {
			t.Fatalf("first turn on %d", d.Replica)
		}
		a.Table().ObserveHits("a", 0, 1000, 0, 100)
		a.Table().Observe("a", 1100)
		pick(t, a, Request{Session: "a", PromptTokens: 2000, Pinned: NoPin}, s, now)
		a.Table().ObserveHits("a", 0, 2000, 0, 100)
		// Fill replica 1 so that 2 has the most room.
		pick(t, a, Request{Session: "big", PromptTokens: 9000, Pinned: NoPin}, s, now)
		d := pick(t, a, Request{Session: "a", PromptTokens: 3000, Pinned: NoPin}, s, now)
		if d.Replica != 2 || d.Reason != ReasonRehome || d.Wait {
			t.Errorf("admission %v: cold turn -> %+v, want replica 2, rehome", adm, d)
		}
		if d.Uncached <= 0 {
			t.Errorf("admission %v: a re-homed turn has no uncached estimate", adm)
		}
	}
}

// TestObserveHitsSharedPrefix: what every conversation finds on a replica
// (a common system prompt, learnt from first turns) is not the
// conversation's own: a history evicted behind it is cold even though the
// system prompt alone is a third of the prompt.
func TestObserveHitsSharedPrefix(t *testing.T) {
	tb := NewTableWindow(0, 0, 0)
	now := time.Unix(0, 0)
	for _, s := range []string{"x", "y"} { // first turns: 3488 of the system prompt cached
		tb.Assign(s, 0, now)
		tb.ObserveHits(s, 0, 10000, 3488, 256)
	}
	if got := tb.SharedHit(); got != 3488 {
		t.Fatalf("SharedHit %d, want 3488", got)
	}
	tb.Assign("a", 0, now)
	tb.ObserveHits("a", 0, 10000, 3488, 256)
	tb.ObserveHits("a", 0, 11000, 3488, 256) // only the system prompt: cold
	if _, _, cold, _ := tb.Hits("a"); !cold {
		t.Error("a history evicted behind the shared prefix is not cold")
	}
	tb.ObserveHits("a", 0, 12000, 9000, 256) // most of its own history: warm
	if _, _, cold, _ := tb.Hits("a"); cold {
		t.Error("a warm turn left the conversation cold")
	}
}
