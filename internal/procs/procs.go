// Package procs sizes a server's GOMAXPROCS to its load.
//
// Why: a proxy spends most of each request waiting on the network. With
// more Ps than its load keeps busy, Go's scheduler wakes an idle P's
// thread for nearly every goroutine that becomes runnable (runtime
// wakep/startm: a futex wake, and the spinning thread's futex sleep after
// it finds nothing), and those thread switches, not the proxy's own work,
// were the larger part of its CPU: at 1,000 requests/s of 64 KiB on two
// cores, warden burnt 488 µs a request with GOMAXPROCS=2 and 364 µs with
// GOMAXPROCS=1, at no cost in latency (issue 13, item 12; `make speed`).
// One P is not enough for every load, though, so the governor measures
// the CPU the process uses (getrusage) and keeps each P about half busy:
// a P more as soon as the load passes 60 % of the Ps, one less once it has
// stayed under 50 % of one fewer for 3 s (the load on fewer Ps is no more
// than on more, so the one cannot undo the other), from 1 up to the CPUs
// Go sees. A server saturated at its current Ps doubles them at once,
// since its true demand cannot be read off a saturated P.
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

// Thresholds of the decision, in busy cores per P.
const (
	upAt       = 0.6 // more Ps once the load passes this share of them
	downAt     = 0.5 // fewer once it stays under this share of one fewer
	saturated  = 0.9 // this busy, demand is unknown: double the Ps
	holdDown   = 12  // intervals under downAt before a P is taken away
	defaultTic = 250 * time.Millisecond
)

// Next returns the Ps for a load of busy cores (CPU seconds per second of
// wall time) at cur Ps, between 1 and maxProcs, and how many intervals in
// a row the load has been low enough to take one away (low, updated).
func Next(cur, maxProcs int, busy float64, low int) (next, lowNext int) {
	switch {
	case cur < maxProcs && busy >= saturated*float64(cur):
		return min(2*cur, maxProcs), 0
	case cur < maxProcs && busy > upAt*float64(cur):
		return cur + 1, 0
	case cur > 1 && busy < downAt*float64(cur-1):
		if low+1 >= holdDown {
			return cur - 1, 0
		}
		return cur, low + 1
	}
	return cur, 0
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
	cur, low := 1, 0
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
			next, l := Next(cur, o.Max, busy, low)
			low = l
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
