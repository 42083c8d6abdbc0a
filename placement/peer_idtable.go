package placement

// idTable maps block ids to non-negative int32 values: the index of the
// peers whose state is a large, churning set of blocks (Dynamo's active
// blocks), where a Go map costs two or three cache misses a lookup and
// its deletions leave tombstones that lengthen later probes. Open
// addressing with linear probing in entries of 16 bytes (one miss a
// lookup), kept at most half full, and backward-shift deletion (no
// tombstones).
type idTable struct {
	ents  []idEntry // a power of two of them
	n     int
	shift uint // 64 - log2(len(ents))
}

// idEntry is one id and its value + 1; 0: an empty entry.
type idEntry struct {
	id  uint64
	val uint32
}

// idTableMin is the fewest entries of a table.
const idTableMin = 1 << 8

// home is the entry where id's probe run starts: the top bits of id
// times 2^64 / phi (ids are hashes already; the multiply spreads any
// that are not).
func (t *idTable) home(id uint64) int { return int((id * 0x9e3779b97f4a7c15) >> t.shift) }

// find returns the entry of id, or the empty entry where it would go.
func (t *idTable) find(id uint64) int {
	mask := len(t.ents) - 1
	for i := t.home(id); ; i = (i + 1) & mask {
		if e := &t.ents[i]; e.val == 0 || e.id == id {
			return i
		}
	}
}

// len returns the number of ids in t.
func (t *idTable) len() int { return t.n }

// get returns id's value; -1 and false when id is absent.
func (t *idTable) get(id uint64) (int32, bool) {
	if t.n == 0 {
		return -1, false
	}
	e := t.ents[t.find(id)]
	return int32(e.val) - 1, e.val != 0
}

// put sets id's value to v >= 0.
func (t *idTable) put(id uint64, v int32) {
	if 2*(t.n+1) > len(t.ents) {
		t.resize(max(idTableMin, 2*len(t.ents)))
	}
	e := &t.ents[t.find(id)]
	if e.val == 0 {
		t.n++
	}
	e.id, e.val = id, uint32(v)+1
}

// del removes id, if present: the entries after it in its probe run that
// would no longer be found move back into the hole.
func (t *idTable) del(id uint64) {
	if t.n == 0 {
		return
	}
	i := t.find(id)
	if t.ents[i].val == 0 {
		return
	}
	t.n--
	mask := len(t.ents) - 1
	for j := (i + 1) & mask; t.ents[j].val != 0; j = (j + 1) & mask {
		// The entry at j may move back to i unless its home lies
		// cyclically in (i, j].
		if h := t.home(t.ents[j].id); (j-h)&mask >= (j-i)&mask {
			t.ents[i] = t.ents[j]
			i = j
		}
	}
	t.ents[i] = idEntry{}
}

// resize moves the ids to a table of n entries, a power of two.
func (t *idTable) resize(n int) {
	old := t.ents
	t.ents = make([]idEntry, n)
	t.shift = 64
	for ; n > 1; n >>= 1 {
		t.shift--
	}
	for _, e := range old {
		if e.val != 0 {
			t.ents[t.find(e.id)] = e
		}
	}
}
