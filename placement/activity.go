package placement

import (
	"math"
	"time"
)

// The learned active window. A conversation counts as active, as load
// still to come on its home (the "conversations held" of the affinity
// score, and with no turn ends reported the KV its home must keep for
// it), while at most the active window has passed since its last
// request. A fixed window of two minutes suits agents whose turns follow
// each other within seconds; it fails agents that pause for minutes (a
// person reading, a long tool run): a paused conversation drops out of
// the count while its prefix is still cached at home and it is still
// coming back, vLLM's gauges show it neither (its blocks are free and
// cached, nothing of it is running), and new conversations pile onto its
// replica, which then evicts the prefixes of the paused ones when they
// return (the 7 x RTX 5090 farm at 16 sessions: 2-5 conversations on one
// replica, 2 on others, hits down to 47-51 % after 40 minutes).
//
// So, unless Config.ActiveWindow fixes it, the table learns the window
// from the conversations it sees: a conversation idle for t is more likely
// paused than over while (1-e) S(t) > e, where S(t) is the share of the
// gaps between two requests of one conversation longer than t, and e the
// share of requests after which a conversation ended. Every conversation
// has one first request and one last one, so over many conversations e is
// the share of requests that start a new conversation, which the table
// counts as they come (a conversation forgotten after its TTL and back is
// counted as a new one: the TTL ended it). The window is the smallest t
// at which (1-e) S(t) <= e: for the product's bench (6 turns, turns one
// after another) that is a few seconds and the floor holds; for agents of
// about 50 turns whose users pause for minutes it is the 98th percentile
// of the gaps, some ten minutes. It is never shorter than
// DefaultActiveWindow, the fixed rule this replaces (short gaps keep their
// behaviour), nor longer than the TTL (a forgotten conversation is not
// active).
//
// The gaps are kept in a histogram of log-spaced buckets (four per
// octave, from 1/16 s to three days) whose weights, with the count of new
// conversations, halve together once they reach learnHalve: the window
// follows the workload as it changes, over the last few thousand
// requests. It is recomputed every learnEvery gaps, from learnMinGaps on;
// a change moves the Active counts at once (more conversations become
// active when it grows; retire drops the others when it shrinks).

const (
	gapPerOctave = 4
	gapMinExp    = -4                // the first bucket holds gaps up to 2^-4 s
	gapBuckets   = 22 * gapPerOctave // up to 2^18 s, three days
	learnMinGaps = 64                // gaps seen before the window is learned
	learnEvery   = 16                // gaps between two recomputations
	learnHalve   = 8192              // total gap weight at which the weights halve
)

// activity is the table's learner of the active window (see above).
type activity struct {
	learn  bool  // the window is learned (Config.ActiveWindow zero)
	floor  int64 // the shortest window, ns: DefaultActiveWindow, at most the TTL
	hist   [gapBuckets]float32
	gaps   float64 // total weight in hist
	starts float64 // new conversations, weighted as hist
	since  int     // gaps since the window was last computed
}

// gapBucket is the bucket of a gap of ns nanoseconds.
func gapBucket(ns int64) int {
	s := float64(ns) / float64(time.Second)
	if s <= math.Exp2(gapMinExp) {
		return 0
	}
	k := int(math.Floor((math.Log2(s) - gapMinExp) * gapPerOctave))
	return min(max(k, 0), gapBuckets-1)
}

// gapUpper is the upper edge of bucket k, in nanoseconds.
func gapUpper(k int) int64 {
	return int64(math.Exp2(float64(k+1)/gapPerOctave+gapMinExp) * float64(time.Second))
}

// halve halves every weight once they have reached learnHalve.
func (a *activity) halve() {
	if a.gaps+a.starts < learnHalve {
		return
	}
	for k := range a.hist {
		a.hist[k] /= 2
	}
	a.gaps /= 2
	a.starts /= 2
}

// window is the learned window for a table whose TTL is ttl (ns), and ok
// false before learnMinGaps gaps.
func (a *activity) window(ttl int64) (w int64, ok bool) {
	if a.gaps < learnMinGaps {
		return 0, false
	}
	// e with one pseudo-count each way, so that a table that has seen no
	// new conversation (one adopted on a reload) does not read e = 0.
	e := (a.starts + 1) / (a.starts + a.gaps + 2)
	tail := e / (1 - e) * a.gaps // the gap weight (1-e) S(t) may keep above t
	w = a.floor
	acc := 0.0
	for k := gapBuckets - 1; k >= 0; k-- {
		acc += float64(a.hist[k])
		if acc > tail {
			w = max(w, gapUpper(k))
			break
		}
	}
	return min(w, ttl), true
}

// noteGap records that the conversation of entry i sent a request at at,
// its gap since its last one, and relearns the window now and then.
func (t *Table) noteGap(i int32, at int64) {
	a := &t.learner
	if !a.learn {
		return
	}
	a.hist[gapBucket(max(at-t.entries[i].seen, 0))]++
	a.gaps++
	a.halve()
	if a.since++; a.since >= learnEvery {
		a.since = 0
		if w, ok := a.window(t.ttl); ok && w != t.window {
			t.setWindow(w, at)
		}
	}
}

// noteStart records a new conversation (its first request) at at. One
// first seen within the table's first active window (the floor) is not
// counted: for all the table knows it was in progress before the table
// was (a restart, a configuration that made a new table, the simulator's
// sessions that all begin at its start), and counting that burst as
// starts doubled e on the 7 x RTX 5090 farm's 16 sessions of ~50 turns
// (31 starts in 690 requests after 34 minutes, 15 of them the first
// burst), which held the window at 2-3 minutes where the gaps call for
// 10 or more.
func (t *Table) noteStart(at int64) {
	if t.learner.learn && at > t.learner.floor {
		t.learner.starts++
		t.learner.halve()
	}
}

// setWindow changes the active window to w at at: when it grows, the
// conversations seen within the new window become active again (the least
// recent active entry's successors, in LRU order, while within it); when
// it shrinks, retire drops those beyond it.
func (t *Table) setWindow(w, at int64) {
	grow := w > t.window
	t.window = w
	if !grow {
		t.retire(at)
		return
	}
	i := t.head
	if t.act != nilIndex {
		i = t.entries[t.act].next
	}
	for ; i != nilIndex && at-t.entries[i].seen <= w; i = t.entries[i].next {
		e := &t.entries[i]
		e.active = true
		c := &t.counts[e.home]
		c.Active++
		c.Footprint += t.fp(i)
		if t.holding(i, at) {
			t.hold(i)
		}
		t.act = i
	}
}

// LearnsWindow reports whether the active window is learned from the
// conversations' gaps (Config.ActiveWindow zero) rather than fixed.
func (t *Table) LearnsWindow() bool { return t.learner.learn }
