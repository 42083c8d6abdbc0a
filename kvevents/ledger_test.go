package kvevents

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// go-zeromq/zmq4 v0.17.0's PUB socket never stops its writer goroutine:
	// its Close cancels the socket but never calls pubMWriter.Close.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}

func stored(hashes ...uint64) Event {
	return Event{Kind: BlockStored, BlockHashes: hashes, BlockSize: 16, GroupIdx: 0}
}
func removed(hashes ...uint64) Event {
	return Event{Kind: BlockRemoved, BlockHashes: hashes, GroupIdx: 0}
}

// TestLedger: blocks held are stored minus removed, duplicates counted per
// physical block; a stored block is cold the first time anywhere,
// elsewhere when another replica had it, evicted when this one had it;
// CPU-tier events and unknown removals change nothing; AllBlocksCleared
// and a restart empty the ledger; a gap makes it incomplete.
func TestLedger(t *testing.T) {
	f := NewFarm(2, 0, 0)
	a, b := f.Replica(0), f.Replica(1)
	a.Batch(0, &Batch{Events: []Event{stored(1, 2, 3)}})
	b.Batch(0, &Batch{Events: []Event{stored(1, 2, 9)}})
	a.Batch(1, &Batch{Events: []Event{removed(3), removed(77), stored(3, 4), stored(4)}})
	cpu := stored(5, 6)
	cpu.Medium = "CPU"
	a.Batch(2, &Batch{Events: []Event{cpu}})
	s := f.Snapshot()
	// a: 1, 2, 3 (re-stored), 4 twice (two physical blocks).
	if s[0].BlocksHeld != 5 || !s[0].Complete {
		t.Errorf("replica 0 holds %d (complete %v), want 5, complete", s[0].BlocksHeld, s[0].Complete)
	}
	if want := (MissTokens{Cold: 4 * 16, Evicted: 16}); s[0].Miss != want {
		t.Errorf("replica 0 miss %+v, want %+v (1,2,3,4 cold; 3 evicted; 4 again: held, no miss)", s[0].Miss, want)
	}
	if want := (MissTokens{Cold: 16, Elsewhere: 32}); s[1].Miss != want || s[1].BlocksHeld != 3 {
		t.Errorf("replica 1 miss %+v held %d, want %+v and 3", s[1].Miss, s[1].BlocksHeld, want)
	}
	a.Lost(3, 5)
	if s := f.Snapshot()[0]; s.Complete || s.Lost != 2 {
		t.Errorf("after a gap: %+v, want incomplete, 2 lost", s)
	}
	a.Batch(5, &Batch{Events: []Event{{Kind: AllBlocksCleared}, stored(8)}})
	if s := f.Snapshot()[0]; !s.Complete || s.BlocksHeld != 1 || s.Clears != 1 {
		t.Errorf("after AllBlocksCleared: %+v, want complete, 1 held", s)
	}
	b.Restarted()
	if s := f.Snapshot()[1]; s.BlocksHeld != 0 || s.Complete || s.Restarts != 1 {
		t.Errorf("after a restart: %+v, want empty and incomplete until seq 0", s)
	}
}

// TestLedgerBounds: a replica's ledger stops at MaxBlocks and says so; the
// ever record forgets its oldest half when full.
func TestLedgerBounds(t *testing.T) {
	f := NewFarm(1, 4, 8)
	r := f.Replica(0)
	r.Batch(0, &Batch{Events: []Event{stored(1, 2, 3, 4, 5, 6)}})
	if s := f.Snapshot()[0]; s.BlocksHeld != 4 || s.Complete {
		t.Errorf("%+v, want 4 held (the bound) and incomplete", s)
	}
	for h := range uint64(100) {
		r.Batch(1+h, &Batch{Events: []Event{stored(1000 + h)}})
	}
	if n := len(f.ever[0]) + len(f.ever[1]); n > 8 {
		t.Errorf("ever record holds %d hashes, bound 8", n)
	}
}
