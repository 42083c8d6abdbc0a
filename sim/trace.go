package sim

import (
	"math"
	"math/bits"

	"github.com/lm-warden/warden/traces"
)

// Trace is a trace file in memory.
type Trace struct {
	Name     string
	Header   traces.Header
	Requests []*traces.Request // in file order
}

// hashCount estimates the number of distinct block hashes of t's requests
// (prompt and output) by linear counting (Whang, Vander-Zanden and Taylor,
// "A linear-time probabilistic counting algorithm for database
// applications", 1990): each id, mixed, marks one bit of a map of m bits,
// and n distinct ids leave about m e^(-n/m) bits clear, so
// n = m ln(m/clear). Its error is a fraction of a percent here; it only
// sizes a table. At a load of 20 and more, no bit is left clear: the ids
// are counted then.
func (t *Trace) hashCount() int {
	total := 0
	for _, r := range t.Requests {
		total += len(r.HashIDs) + len(r.OutputHashIDs)
	}
	if total == 0 {
		return 0
	}
	// m at least a quarter of the ids (a load up to 4 keeps 2 % of the
	// bits clear: a fine estimate), at most 2^18 bits: 32 KiB, a first-level
	// cache, where random bits cost least.
	b := uint(min(max(bits.Len(uint(total/4)), 12), 18))
	m := uint64(1) << b
	var bitmap [1 << 18 / 64]uint64
	for _, r := range t.Requests {
		for _, ids := range [2][]uint64{r.HashIDs, r.OutputHashIDs} {
			for _, id := range ids {
				// Ids need not be uniform: murmur3's finaliser spreads them.
				id ^= id >> 33
				id *= 0xff51afd7ed558ccd
				id ^= id >> 33
				id *= 0xc4ceb9fe1a85ec53
				id ^= id >> 33
				k := id >> (64 - b)
				bitmap[k/64] |= 1 << (k % 64)
			}
		}
	}
	set := 0
	for _, w := range bitmap[:max(m/64, 1)] {
		set += bits.OnesCount64(w)
	}
	zeros := m - uint64(set)
	if zeros == 0 {
		return total
	}
	return min(total, int(math.Ceil(float64(m)*math.Log(float64(m)/float64(zeros)))))
}

// LoadTrace reads a whole trace file (JSONL, optionally gzipped), its
// lines parsed on several goroutines (traces.Reader.ReadAll).
func LoadTrace(path string) (*Trace, error) {
	rd, err := traces.Open(path, traces.ReaderOptions{})
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	reqs, err := rd.ReadAll()
	if err != nil {
		return nil, err
	}
	return &Trace{Name: path, Header: rd.Header(), Requests: reqs}, nil
}

// sessions groups the trace's requests by session, in order of first
// appearance.
func (t *Trace) sessions() []traces.Session {
	index := map[string]int{}
	var out []traces.Session
	for _, r := range t.Requests {
		i, ok := index[r.Session]
		if !ok {
			i = len(out)
			index[r.Session] = i
			out = append(out, traces.Session{ID: r.Session, Parent: r.Parent})
		}
		out[i].Turns = append(out[i].Turns, *r)
	}
	return out
}

func countSessions(reqs []*traces.Request) int {
	seen := map[string]struct{}{}
	for _, r := range reqs {
		seen[r.Session] = struct{}{}
	}
	return len(seen)
}

// hashHint is an estimate of a trace's distinct block hashes made on
// another goroutine, and for each run a table of everSet slots sized for
// them, its pages already touched (so that the run does not stop for the
// kernel to map 8 MB of them as it fills the table).
type hashHint struct {
	tables chan []everSlot
}

// newHashHint returns a hint for runs runs, to prepare.
func newHashHint(runs int) *hashHint {
	return &hashHint{tables: make(chan []everSlot, runs)}
}

// prepare counts t's hashes and makes the runs' tables.
func (h *hashHint) prepare(t *Trace, runs int) {
	n := t.hashCount()
	n += n / 8
	if n == 0 {
		close(h.tables)
		return
	}
	for range runs {
		slots := make([]everSlot, 1<<bits.Len(uint(2*n-1)))
		for i := 0; i < len(slots); i += 4096 / 16 {
			slots[i].val = 0 // a page is mapped at its first write
		}
		h.tables <- slots
	}
	close(h.tables)
}

// take returns a table once one is prepared (nil, true when none is).
func (h *hashHint) take() ([]everSlot, bool) {
	select {
	case t := <-h.tables:
		return t, true
	default:
		return nil, false
	}
}
