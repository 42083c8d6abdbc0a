package placement

// lruSet is a set of at most cap keys in recency order, as
// hashicorp/golang-lru's Cache holds them (the peers' indexes use it): Add
// of a present key makes it the most recent, Add of a new key to a full set
// evicts the least recent, a lookup does not change the order.
type lruSet struct {
	cap        int
	idx        map[uint64]int32
	keys       []uint64
	prev, next []int32
	head, tail int32 // head: most recent; -1 when empty
	free       []int32
}

func newLRUSet(capacity int) *lruSet {
	return &lruSet{cap: max(capacity, 1), idx: make(map[uint64]int32), head: -1, tail: -1}
}

func (l *lruSet) len() int { return len(l.idx) }

func (l *lruSet) has(k uint64) bool { _, ok := l.idx[k]; return ok }

func (l *lruSet) unlink(i int32) {
	p, n := l.prev[i], l.next[i]
	if p >= 0 {
		l.next[p] = n
	} else {
		l.head = n
	}
	if n >= 0 {
		l.prev[n] = p
	} else {
		l.tail = p
	}
}

func (l *lruSet) pushFront(i int32) {
	l.prev[i], l.next[i] = -1, l.head
	if l.head >= 0 {
		l.prev[l.head] = i
	}
	l.head = i
	if l.tail < 0 {
		l.tail = i
	}
}

// add inserts k or refreshes it; it returns the key it evicted, if any.
func (l *lruSet) add(k uint64) (evicted uint64, ok bool) {
	if i, present := l.idx[k]; present {
		if l.head != i {
			l.unlink(i)
			l.pushFront(i)
		}
		return 0, false
	}
	if len(l.idx) >= l.cap {
		t := l.tail
		evicted, ok = l.keys[t], true
		l.unlink(t)
		delete(l.idx, evicted)
		l.free = append(l.free, t)
	}
	var i int32
	if n := len(l.free); n > 0 {
		i = l.free[n-1]
		l.free = l.free[:n-1]
		l.keys[i] = k
	} else {
		i = int32(len(l.keys))
		l.keys = append(l.keys, k)
		l.prev = append(l.prev, -1)
		l.next = append(l.next, -1)
	}
	l.idx[k] = i
	l.pushFront(i)
	return evicted, ok
}

// remove deletes k if present.
func (l *lruSet) remove(k uint64) {
	i, ok := l.idx[k]
	if !ok {
		return
	}
	l.unlink(i)
	delete(l.idx, k)
	l.free = append(l.free, i)
}

// oldest returns the least recent key.
func (l *lruSet) oldest() (uint64, bool) {
	if l.tail < 0 {
		return 0, false
	}
	return l.keys[l.tail], true
}
