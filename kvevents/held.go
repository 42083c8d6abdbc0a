package kvevents

// Leading returns how many of hashes, in order, replica i's prefix cache
// holds now on the GPU (KV-cache group 0, full attention), counting from
// the first to the first it lacks: what vLLM's find_longest_cache_hit
// would find for a prompt whose engine block hashes are hashes. ok is
// false when the ledger cannot tell: batches were lost (or published
// before warden subscribed) since the last AllBlocksCleared, or it reached
// its bound, so a block it lacks may be held and one it has may be gone.
func (f *Farm) Leading(i int, hashes []uint64) (n int, ok bool) {
	if i < 0 || i >= len(f.replicas) {
		return 0, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.replicas[i]
	if !l.complete || l.overflow {
		return 0, false
	}
	for _, h := range hashes {
		if l.held[ledgerKey{h, 0}] == 0 {
			break
		}
		n++
	}
	return n, true
}
