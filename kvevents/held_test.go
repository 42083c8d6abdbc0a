package kvevents

import "testing"

// TestLeading: the leading run of a prompt's engine blocks a replica
// holds, to the first it lacks (a later block held past a gap does not
// count, as vLLM's lookup stops at the first miss); a removed block ends
// the run; an incomplete ledger cannot tell.
func TestLeading(t *testing.T) {
	f := NewFarm(2, 0, 0)
	a, b := f.Replica(0), f.Replica(1)
	a.Batch(0, &Batch{Events: []Event{stored(1, 2, 3), stored(5)}})
	b.Batch(0, &Batch{Events: []Event{stored(1)}})
	for _, tt := range []struct {
		replica int
		hashes  []uint64
		want    int
	}{
		{0, []uint64{1, 2, 3, 4, 5}, 3},
		{0, []uint64{9, 1}, 0},
		{0, nil, 0},
		{1, []uint64{1, 2, 3}, 1},
	} {
		if n, ok := f.Leading(tt.replica, tt.hashes); !ok || n != tt.want {
			t.Errorf("replica %d %v: %d %v, want %d", tt.replica, tt.hashes, n, ok, tt.want)
		}
	}
	a.Batch(1, &Batch{Events: []Event{removed(2)}})
	if n, _ := f.Leading(0, []uint64{1, 2, 3}); n != 1 {
		t.Errorf("after removing block 2: %d, want 1", n)
	}
	cpu := stored(7)
	cpu.Medium = "CPU"
	a.Batch(2, &Batch{Events: []Event{cpu}})
	if n, _ := f.Leading(0, []uint64{7}); n != 0 {
		t.Errorf("a CPU-tier block counts: %d", n)
	}
	a.Lost(3, 4)
	if _, ok := f.Leading(0, []uint64{1}); ok {
		t.Error("an incomplete ledger says it knows")
	}
	if _, ok := f.Leading(5, []uint64{1}); ok {
		t.Error("replica 5 of 2 says it knows")
	}
}
