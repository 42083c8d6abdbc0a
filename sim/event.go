package sim

// Virtual time is an int64 count of microseconds since the start of a run.
// One simulated hour is 3.6e9 µs, far from overflow.

const (
	usPerMs  = 1000
	usPerSec = 1000 * 1000
)

// eventKind says what an event does when it fires.
type eventKind uint8

const (
	evStepEnd   eventKind = iota // a replica's engine step ends (arg: replica)
	evSend                       // a client sends a request (arg: client slot or trace index)
	evScrape                     // scrape instant: refresh the snapshot, append metric samples
	evStop                       // stop the event loop (end of a measured step)
	evKick                       // an idle replica looks at its queues (arg: replica)
	evArrive                     // a sent request reaches its server (arg: pending slot)
	evPublish                    // the DP coordinator publishes the engines' counts
	evAdmit                      // the router admits waiting conversations (routing.go)
	evTokenised                  // an API server is done with a request (arg: pending slot)
	evRelease                    // the client has read an answer: its connection is idle (arg: API server)
	evRefresh                    // a policy with its own scrape interval reads the gauges (placement.Scraper)
)

// event is one entry of the event heap. Ties in time are broken by seq, the
// order in which events were pushed, so a run is fully deterministic.
type event struct {
	at   int64
	seq  uint64
	kind eventKind
	arg  int32
}

func (e event) before(o event) bool {
	if e.at != o.at {
		return e.at < o.at
	}
	return e.seq < o.seq
}

// eventHeap is a binary min-heap of events ordered by (at, seq). It is
// written out rather than built on container/heap so that push and pop do
// not box events in interfaces (no allocation once the slice has grown).
type eventHeap struct {
	items []event
	seq   uint64
}

func (h *eventHeap) len() int { return len(h.items) }

// push adds an event at time at.
func (h *eventHeap) push(at int64, kind eventKind, arg int32) {
	h.seq++
	h.items = append(h.items, event{at: at, seq: h.seq, kind: kind, arg: arg})
	i := len(h.items) - 1
	for i > 0 {
		parent := (i - 1) / 2
		if !h.items[i].before(h.items[parent]) {
			break
		}
		h.items[i], h.items[parent] = h.items[parent], h.items[i]
		i = parent
	}
}

// peek returns the earliest event; the heap must not be empty.
func (h *eventHeap) peek() event { return h.items[0] }

// pop removes and returns the earliest event; the heap must not be empty.
func (h *eventHeap) pop() event {
	top := h.items[0]
	last := len(h.items) - 1
	h.items[0] = h.items[last]
	h.items = h.items[:last]
	i, n := 0, last
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h.items[r].before(h.items[l]) {
			m = r
		}
		if !h.items[m].before(h.items[i]) {
			break
		}
		h.items[i], h.items[m] = h.items[m], h.items[i]
		i = m
	}
	return top
}
