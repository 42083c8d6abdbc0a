// Package procs sizes a server's GOMAXPROCS to its load.
//
// Why: a proxy spends most of each request waiting on the network. With
// more Ps than its load keeps busy, Go's scheduler wakes an idle P's
// thread for nearly every goroutine that becomes runnable (runtime
// wakep/startm: a futex wake, and the spinning thread's futex sleep after
// it finds nothing), and those thread switches, not the proxy's own work,
// were the larger part of its CPU: at 1,000 requests/s of 64 KiB on two
// cores, warden burnt 488 µs a request with GOMAXPROCS=2 and 364 µs with
// GOMAXPROCS=1 (issue 13, item 12; `make speed`).
// One P is not enough for every load, though, so the governor measures
// the CPU the process uses (getrusage) and keeps each P at most three
// quarters busy (there a request waits about one and a half times its own
// CPU time for the P, some 0.3 ms: more Ps cost more than that saves). A
// P more once the load has passed 75 % of the Ps for a second (twice
// as many if they were saturated: demand cannot be read off a saturated
// P); one less once its mean over 3 s is under 70 % of one fewer; from 1
// up to the CPUs Go sees. The load on fewer Ps is no more than on more
// (there are fewer to wake), so a step down is never undone by the same
// load; and since the load read at more Ps includes their wake-ups, a step
// down is taken while the load still looks nearly full, or a load that
// fits on one fewer would never move back.
//
// It is what GOMAXPROCS=N in the environment overrides (Auto says so).
package procs

import (
	"context"
	"log/slog"
	"os"
	"runtime"
	"syscall"
	"time"
)

// Thresholds of the decision, in busy cores per P, and how long a load
// must last to move the Ps.
const (
	upAt       = 0.75 // more Ps once the load passes this share of them
	downAt     = 0.7  // fewer once its mean stays under this share of one fewer
	saturated  = 0.9  // this busy, demand is unknown: double the Ps
	holdUp     = 4    // intervals in a row over upAt before a P is added
	holdDown   = 12   // intervals whose mean decides a step down
	defaultTic = 250 * time.Millisecond
)

// State is what Next remembers between intervals: how many in a row the
// load has been high enough to add a P, and the intervals (N, their load
// summed) of the window that decides a step down.
type State struct {
	High int
	N    int
	Sum  float64
}

// Next returns the Ps for a load of busy cores (CPU seconds per second of
// wall time) at cur Ps, between 1 and maxProcs. A load must last holdUp
// intervals to add Ps (a burst of new connections at the start of a load,
// half a second over 75 % at 1,000 requests/s of 256 KiB, is not one: the
// Ps it added stayed for seconds, at a third more CPU a request); a step
// down is decided on the mean of holdDown intervals.
func Next(cur, maxProcs int, busy float64, st State) (int, State) {
	if cur < maxProcs && busy > upAt*float64(cur) {
		if st.High+1 < holdUp {
			return cur, State{High: st.High + 1}
		}
		if busy >= saturated*float64(cur) {
			return min(2*cur, maxProcs), State{}
		}
		return cur + 1, State{}
	}
	if cur <= 1 {
		return cur, State{}
	}
	st = State{N: st.N + 1, Sum: st.Sum + busy}
	if st.N < holdDown {
		return cur, st
	}
	if st.Sum/float64(st.N) < downAt*float64(cur-1) {
		return cur - 1, State{}
	}
	return cur, State{}
}

// Options of Run. Zero fields take the defaults.
type Options struct {
	Max      int           // most Ps; default runtime.NumCPU()
	Interval time.Duration // how often the load is read; default 250ms
	Log      *slog.Logger  // each change, at debug level; default: none

	// For tests: the process's CPU time so far, and what sets the Ps.
	CPU func() time.Duration
	Set func(n int)
}

// Auto reports whether the governor should run: not where GOMAXPROCS is
// set in the environment (an operator's choice is kept).
func Auto() bool { return os.Getenv("GOMAXPROCS") == "" }

// Run governs the Ps until ctx is done, starting from one. It returns at
// once if there is only one CPU.
func Run(ctx context.Context, o Options) {
	if o.Max <= 0 {
		o.Max = runtime.NumCPU()
	}
	if o.Interval <= 0 {
		o.Interval = defaultTic
	}
	if o.CPU == nil {
		o.CPU = processCPU
	}
	if o.Set == nil {
		o.Set = func(n int) { runtime.GOMAXPROCS(n) }
	}
	if o.Max <= 1 {
		return
	}
	cur, st := 1, State{}
	o.Set(cur)
	t := time.NewTicker(o.Interval)
	defer t.Stop()
	lastCPU, lastAt := o.CPU(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			c := o.CPU()
			wall := now.Sub(lastAt)
			if wall <= 0 {
				continue
			}
			busy := float64(c-lastCPU) / float64(wall)
			lastCPU, lastAt = c, now
			var next int
			next, st = Next(cur, o.Max, busy, st)
			if next != cur {
				if o.Log != nil {
					o.Log.Debug("GOMAXPROCS", "from", cur, "to", next, "busy_cores", busy)
				}
				cur = next
				o.Set(cur)
			}
		}
	}
}

// processCPU is the user and system CPU time of the process so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
