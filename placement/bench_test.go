package placement

import (
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"
)

const benchSessions = 1 << 20 // "1M sessions in the table"

// benchIDs returns 2*benchSessions distinct session ids, built once.
var benchIDs = func() func() []string {
	var ids []string
	return func() []string {
		if ids == nil {
			ids = make([]string, 2*benchSessions)
			for i := range ids {
				ids[i] = "session-" + strconv.Itoa(i)
			}
		}
		return ids
	}
}()

// benchAffinity returns an affinity policy whose table holds the first
// benchSessions ids, spread over n replicas, and a snapshot of n replicas
// below the spill threshold.
func benchAffinity(n int, now time.Time) (*Affinity, *Snapshot) {
	ids := benchIDs()
	a := NewAffinity(Config{MaxSessions: benchSessions})
	for i := range benchSessions {
		a.Table().Assign(ids[i], i%n, now)
	}
	s := farm(n, 32)
	for i := range s.Replicas {
		s.Replicas[i].InFlight = 1 + i%3
		s.Replicas[i].KVUsage = float64(i%10) / 10
	}
	return a, s
}

// BenchmarkAffinity times one decision with 8 and 64 replicas and 1M
// sessions in the table: a later turn (sticky) and a new conversation,
// which also evicts the least-recently-used session (the table is full).
func BenchmarkAffinity(b *testing.B) {
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("replicas=%d/sticky", n), func(b *testing.B) {
			now := t0
			a, s := benchAffinity(n, now)
			ids := benchIDs()[:benchSessions]
			r := Request{Pinned: NoPin}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				r.Session = ids[i%len(ids)]
				now = now.Add(time.Microsecond)
				if d, err := a.Pick(&r, s, now); err != nil || d.Reason != ReasonSticky {
					b.Fatalf("%v %v, want sticky", d, err)
				}
				i++
			}
		})
		b.Run(fmt.Sprintf("replicas=%d/new", n), func(b *testing.B) {
			now := t0
			a, s := benchAffinity(n, now)
			ids := benchIDs()
			r := Request{Pinned: NoPin}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				// Cycling through 2M ids with 1M in an LRU table: every id
				// is absent when its turn comes.
				r.Session = ids[(benchSessions+i)%len(ids)]
				now = now.Add(time.Microsecond)
				if d, err := a.Pick(&r, s, now); err != nil || d.Reason != ReasonNew {
					b.Fatalf("%v %v, want new", d, err)
				}
				i++
			}
		})
	}
}

// BenchmarkAffinityActiveWindow times later turns while conversations
// keep leaving the active window: 1M sessions seen 1µs apart, a 100ms
// window and the clock moving 1µs per decision, so every decision also
// retires about one conversation from the Active counts.
func BenchmarkAffinityActiveWindow(b *testing.B) {
	const n = 8
	ids := benchIDs()[:benchSessions]
	a := NewAffinity(Config{MaxSessions: benchSessions, ActiveWindow: 100 * time.Millisecond})
	now := t0
	for i, id := range ids {
		now = now.Add(time.Microsecond)
		a.Table().Assign(id, i%n, now)
	}
	now = now.Add(time.Microsecond)
	a.Table().Advance(now) // the backlog of the setup, retired untimed
	s := farm(n, 32)
	r := Request{Pinned: NoPin}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		r.Session = ids[i%len(ids)]
		now = now.Add(time.Microsecond)
		if d, err := a.Pick(&r, s, now); err != nil || d.Reason != ReasonSticky {
			b.Fatalf("%v %v, want sticky", d, err)
		}
		i++
	}
}

func BenchmarkLeastLoaded(b *testing.B) {
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("replicas=%d", n), func(b *testing.B) {
			var ll LeastLoaded
			s := farm(n, 32)
			for i := range s.Replicas {
				s.Replicas[i].Running, s.Replicas[i].Waiting = i%7, i%3
			}
			r := Request{Session: "a", Pinned: NoPin}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if i%64 == 0 {
					s.Generation++ // a scrape now and then resets the local increments
				}
				if _, err := ll.Pick(&r, s, t0); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

func BenchmarkHash(b *testing.B) {
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("replicas=%d", n), func(b *testing.B) {
			var h Hash
			s := farm(n, 32)
			ids := benchIDs()[:4096]
			r := Request{Pinned: NoPin}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				r.Session = ids[i%len(ids)]
				if _, err := h.Pick(&r, s, t0); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

// BenchmarkTableBytesPerSession measures the heap held by a table of 1M
// sessions (the ids themselves are not counted: the table does not keep
// them) and reports it as bytes/session; the timed loop is Table.Home on
// that table.
func BenchmarkTableBytesPerSession(b *testing.B) {
	ids := benchIDs()[:benchSessions]
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tab := NewTable(0, benchSessions)
	for i, id := range ids {
		tab.Assign(id, i%8, t0)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	perSession := float64(after.HeapAlloc-before.HeapAlloc) / float64(tab.Len())
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, ok := tab.Home(ids[i%len(ids)], t0); !ok {
			b.Fatal("session missing")
		}
		i++
	}
	b.ReportMetric(perSession, "bytes/session")
	runtime.KeepAlive(tab)
}

// BenchmarkTableReload times what a proxy reload does to a model's table of
// 1M sessions on 8 replicas, all active, under the model's lock: Renumber
// to a new replica order (two replicas swap places) and Reconfigure to
// another active window (every Active count is recomputed).
func BenchmarkTableReload(b *testing.B) {
	ids := benchIDs()[:benchSessions]
	tab := NewTable(time.Hour, benchSessions)
	for i, id := range ids {
		tab.Assign(id, i%8, t0)
	}
	to := []int{1, 0, 2, 3, 4, 5, 6, 7}
	windows := []time.Duration{time.Minute, 2 * time.Minute}
	i := 0
	for b.Loop() {
		tab.Renumber(to)
		tab.Reconfigure(time.Hour, benchSessions, windows[i%2], t0)
		i++
	}
	if tab.Len() != benchSessions {
		b.Fatalf("%d sessions after the reloads, want %d", tab.Len(), benchSessions)
	}
}

// BenchmarkAffinityKV times one decision with every KV-aware option on
// (balance kv, spill priced, admission kv) at 8 and 64 replicas and 1M
// sessions in the table: a later turn (priced against every other
// replica), the same with the turn's Table.Start and Table.Finish (turn),
// a new conversation (placed by headroom, evicting the LRU session), and
// a new conversation that must wait (nothing fits).
func BenchmarkAffinityKV(b *testing.B) {
	cfg := Config{MaxSessions: benchSessions, Balance: BalanceKV, Admission: AdmissionKV, Spill: SpillPriced()}
	setup := func(n int, capacity int, now time.Time) (*Affinity, *Snapshot) {
		ids := benchIDs()
		a := NewAffinity(cfg)
		for i := range benchSessions {
			a.Table().Assign(ids[i], i%n, now)
			a.Table().Observe(ids[i], 1000+i%5000)
		}
		s := farm(n, 32)
		for i := range s.Replicas {
			r := &s.Replicas[i]
			r.InFlight = 1 + i%3
			r.KVUsage = float64(i%10) / 10
			r.KVCapacityTokens = capacity
			r.PrefillTokensPerSec = 4000 + float64(i%4)*100
			r.PrefillQueueTokens = (i % 5) * 3000
		}
		return a, s
	}
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("replicas=%d/later", n), func(b *testing.B) {
			now := t0
			a, s := setup(n, 1<<40, now)
			ids := benchIDs()[:benchSessions]
			r := Request{Pinned: NoPin, PromptTokens: 9000, SharedPrefixTokens: 3000}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				r.Session = ids[i%len(ids)]
				now = now.Add(time.Microsecond)
				if d, err := a.Pick(&r, s, now); err != nil || d.Wait {
					b.Fatalf("%v %v, want a placement", d, err)
				}
				i++
			}
		})
		b.Run(fmt.Sprintf("replicas=%d/turn", n), func(b *testing.B) {
			// A later turn as the proxy runs it: the decision, then
			// Table.Start and Table.Finish (the hold's release scheduled).
			now := t0
			a, s := setup(n, 1<<40, now)
			ids := benchIDs()[:benchSessions]
			r := Request{Pinned: NoPin, PromptTokens: 9000, SharedPrefixTokens: 3000}
			tab := a.Table()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				r.Session = ids[i%len(ids)]
				now = now.Add(time.Microsecond)
				if d, err := a.Pick(&r, s, now); err != nil || d.Wait {
					b.Fatalf("%v %v, want a placement", d, err)
				}
				tab.Start(r.Session, now)
				tab.Finish(r.Session, 9200, now)
				i++
			}
		})
		b.Run(fmt.Sprintf("replicas=%d/new", n), func(b *testing.B) {
			now := t0
			a, s := setup(n, 1<<40, now)
			ids := benchIDs()
			r := Request{Pinned: NoPin, PromptTokens: 9000, SharedPrefixTokens: 3000}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				r.Session = ids[(benchSessions+i)%len(ids)]
				now = now.Add(time.Microsecond)
				if d, err := a.Pick(&r, s, now); err != nil || d.Reason != ReasonNew || d.Wait {
					b.Fatalf("%v %v, want new", d, err)
				}
				i++
			}
		})
		b.Run(fmt.Sprintf("replicas=%d/wait", n), func(b *testing.B) {
			now := t0
			a, s := setup(n, 1000, now)
			// Sessions the table has never seen, whatever the number of
			// iterations: a wait leaves the table as it was, so the ids
			// past the table's cycle among themselves (running on into
			// ids[0:benchSessions], the table's own, made later turns).
			unseen := benchIDs()[benchSessions:]
			r := Request{Pinned: NoPin, PromptTokens: 9000, SharedPrefixTokens: 3000}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				r.Session = unseen[i%len(unseen)]
				now = now.Add(time.Microsecond)
				if d, err := a.Pick(&r, s, now); err != nil || !d.Wait {
					b.Fatalf("%v %v, want wait", d, err)
				}
				i++
			}
		})
	}
}
