package kvevents

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Farm follows the KV events of a model's replicas: per replica the blocks
// its prefix cache holds (stored minus removed) and why each block it
// stored had to be computed, classified as the simulator classifies its
// misses (sim.MissTokens): evicted when this replica had cached the block
// before, elsewhere when only another replica had, cold otherwise. Every
// structure is bounded: a replica's ledger holds at most MaxBlocks hashes
// (beyond, it stops adding and says it is incomplete), and the record of
// hashes ever stored keeps at most MaxEver, forgetting the oldest half
// when full. Safe for concurrent use: one subscriber goroutine per
// replica feeds it (Replica), the status page reads it (Snapshot) without
// waiting: each replica publishes a copy of its status after every change
// (a batch of a million hashes held the lock for two seconds, and
// /api/status with it).
type Farm struct {
	maxBlocks int
	maxEver   int

	mu       sync.Mutex
	replicas []*ledger
	ever     [2]map[uint64]uint64 // current and previous generation: hash -> replicas' bits
}

// ledgerKey is a cached block: its hash and KV-cache group.
type ledgerKey struct {
	hash  uint64
	group int32
}

type ledger struct {
	farm *Farm
	id   int

	held     map[ledgerKey]uint32 // blocks holding each key (vLLM does not dedupe)
	heldN    int64
	complete bool // every batch since the last AllBlocksCleared (or the start, at seq 0) was seen
	overflow bool
	st       ReplicaStatus
	pub      atomic.Pointer[ReplicaStatus] // st as last published, for Snapshot
}

// ReplicaStatus is what the events say of one replica.
type ReplicaStatus struct {
	Connected bool   `json:"connected"`
	Error     string `json:"error,omitempty"` // why not connected
	// BlocksHeld are the GPU blocks the prefix cache holds: stored minus
	// removed. Complete is false while batches were lost (or published
	// before warden subscribed) since the last AllBlocksCleared, or the
	// ledger reached its bound: the count is then a lower bound.
	BlocksHeld int64 `json:"blocks_held"`
	Complete   bool  `json:"complete"`
	// Miss are the tokens of the blocks stored since the start, by why they
	// were computed (blocks x block_size). Cold includes the blocks of
	// generated tokens, which vLLM caches too.
	Miss    MissTokens `json:"miss_tokens"`
	Batches int64      `json:"batches"`
	// WireForm is the form of the last batch (Form: array, map,
	// batch-map): which of vLLM's encodings the replica speaks.
	WireForm string `json:"wire_form,omitempty"`
	// Undecodable counts batches that did not decode (a changed wire
	// format?), BadPayload the last one's error.
	Undecodable int64  `json:"batches_undecodable"`
	BadPayload  string `json:"last_decode_error,omitempty"`
	// Lost counts batches missed: gaps replay could not fill, batches
	// undecodable or dropped.
	Lost int64 `json:"batches_lost"`
	// Dropped counts batches that came faster than the publisher's bound
	// on work (batches or block hashes per second) and were dropped,
	// counted lost too; LastDrop names the bound.
	Dropped   int64     `json:"batches_dropped"`
	LastDrop  string    `json:"last_drop,omitempty"`
	Restarts  int64     `json:"restarts"`
	Clears    int64     `json:"clears"`
	LastSeq   uint64    `json:"last_seq"`
	LastBatch time.Time `json:"last_batch,omitzero"`
}

// MissTokens are computed prompt tokens by class (sim.MissTokens' names).
type MissTokens struct {
	Cold      int64 `json:"cold"`
	Evicted   int64 `json:"evicted"`
	Elsewhere int64 `json:"elsewhere"`
}

// Default bounds of a Farm.
const (
	DefaultMaxBlocks = 1 << 20 // per replica: 16M tokens at block_size 16
	DefaultMaxEver   = 1 << 21
)

// NewFarm returns a Farm of n replicas (at most 64: the ever record keeps
// one bit per replica); maxBlocks and maxEver of 0 take the defaults.
func NewFarm(n, maxBlocks, maxEver int) *Farm {
	if maxBlocks <= 0 {
		maxBlocks = DefaultMaxBlocks
	}
	if maxEver <= 0 {
		maxEver = DefaultMaxEver
	}
	n = min(n, 64)
	f := &Farm{maxBlocks: maxBlocks, maxEver: maxEver, ever: [2]map[uint64]uint64{{}, {}}}
	for i := range n {
		l := &ledger{farm: f, id: i, held: map[ledgerKey]uint32{}}
		l.publish()
		f.replicas = append(f.replicas, l)
	}
	return f
}

// Replica is replica i's Handler, to give Subscribe.
func (f *Farm) Replica(i int) Handler { return f.replicas[i] }

// Len is the number of replicas.
func (f *Farm) Len() int { return len(f.replicas) }

// Snapshot returns every replica's status, by index, as each replica last
// published it: it takes no lock, so a batch being counted never holds it up.
func (f *Farm) Snapshot() []ReplicaStatus {
	out := make([]ReplicaStatus, len(f.replicas))
	for i, l := range f.replicas {
		out[i] = *l.pub.Load()
	}
	return out
}

// publish makes the ledger's status what Snapshot reads. Called with the
// farm's lock held (or before the farm is shared).
func (l *ledger) publish() {
	st := l.st
	st.BlocksHeld = l.heldN
	st.Complete = l.complete && !l.overflow
	l.pub.Store(&st)
}

// add adds n to the counter c, saturating at MaxInt64: a peer's numbers
// never make a counter negative.
func add(c *int64, n uint64) {
	if n > uint64(math.MaxInt64-*c) {
		*c = math.MaxInt64
		return
	}
	*c += int64(n)
}

// chunk is how many hashes a batch counts before it lets the farm's lock
// go for a moment: the other replicas' subscribers wait on it.
const chunk = 4096

// seen reports whether replica rep, and any replica, stored hash before.
func (f *Farm) seen(hash uint64, rep int) (here, anywhere bool) {
	bits := f.ever[0][hash] | f.ever[1][hash]
	return bits&(1<<rep) != 0, bits != 0
}

func (f *Farm) remember(hash uint64, rep int) {
	if len(f.ever[0]) >= f.maxEver/2 {
		f.ever[1], f.ever[0] = f.ever[0], make(map[uint64]uint64, len(f.ever[0]))
	}
	f.ever[0][hash] |= 1 << rep
}

func (l *ledger) Batch(seq uint64, b *Batch) {
	f := l.farm
	f.mu.Lock()
	defer f.mu.Unlock()
	defer l.publish()
	counted := 0
	breathe := func() {
		if counted++; counted%chunk == 0 {
			f.mu.Unlock()
			f.mu.Lock()
		}
	}
	add(&l.st.Batches, 1)
	l.st.WireForm = b.Form.String()
	l.st.LastSeq = seq
	if b.TS > 0 && b.TS < 1e10 { // a peer's float: NaN, ±Inf and the far future are no time
		l.st.LastBatch = time.Unix(0, int64(b.TS*1e9))
	}
	if seq == 0 {
		l.complete = true // the publisher's first batch: nothing came before
	}
	for i := range b.Events {
		e := &b.Events[i]
		switch e.Kind {
		case AllBlocksCleared:
			clear(l.held)
			l.heldN, l.complete, l.overflow = 0, true, false
			add(&l.st.Clears, 1)
		case BlockStored:
			if !e.OnGPU() {
				continue
			}
			for _, h := range e.BlockHashes {
				breathe()
				k := ledgerKey{h, int32(e.GroupIdx)}
				if l.held[k] == 0 { // a duplicate of a held block is no miss
					here, anywhere := f.seen(h, l.id)
					switch {
					case here:
						add(&l.st.Miss.Evicted, uint64(e.BlockSize))
					case anywhere:
						add(&l.st.Miss.Elsewhere, uint64(e.BlockSize))
					default:
						add(&l.st.Miss.Cold, uint64(e.BlockSize))
					}
					if len(l.held) >= f.maxBlocks {
						l.overflow = true
						f.remember(h, l.id)
						continue
					}
				}
				f.remember(h, l.id)
				l.held[k]++
				l.heldN++
			}
		case BlockRemoved:
			if !e.OnGPU() {
				continue
			}
			for _, h := range e.BlockHashes {
				breathe()
				k := ledgerKey{h, int32(e.GroupIdx)}
				switch n := l.held[k]; n {
				case 0: // stored before we knew of it
				case 1:
					delete(l.held, k)
					l.heldN--
				default:
					l.held[k] = n - 1
					l.heldN--
				}
			}
		}
	}
}

func (l *ledger) Lost(from, to uint64) {
	l.farm.mu.Lock()
	if to > from {
		add(&l.st.Lost, to-from)
	}
	l.complete = false
	l.publish()
	l.farm.mu.Unlock()
}

func (l *ledger) Dropped(_ uint64, what string) {
	l.farm.mu.Lock()
	add(&l.st.Dropped, 1)
	l.st.LastDrop = "over the bound on " + what + " per second"
	l.publish()
	l.farm.mu.Unlock()
}

func (l *ledger) Undecodable(_ uint64, err error) {
	l.farm.mu.Lock()
	add(&l.st.Undecodable, 1)
	l.st.BadPayload = err.Error()
	l.publish()
	l.farm.mu.Unlock()
}

func (l *ledger) Restarted() {
	l.farm.mu.Lock()
	clear(l.held)
	l.heldN, l.complete, l.overflow = 0, false, false
	add(&l.st.Restarts, 1)
	l.publish()
	l.farm.mu.Unlock()
}

func (l *ledger) Status(connected bool, err error) {
	l.farm.mu.Lock()
	l.st.Connected = connected
	l.st.Error = ""
	if err != nil {
		l.st.Error = err.Error()
	}
	l.publish()
	l.farm.mu.Unlock()
}
