package main

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress shows a long run's progress on stderr: a bar on a terminal, and
// elsewhere (a log file, a CI job, a pipe) a line every few seconds of wall
// time, so that a run of minutes is never silent. Both tell the time
// elapsed and the estimate left from one clock of their own (the wall
// clock; tests inject one), so the bar's clock is the wall clock's.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	bar   *progressbar.ProgressBar // nil: lines
	desc  string
	every time.Duration // lines: wall time between two
	now   func() time.Time
	start time.Time
	last  time.Time // the last line written (lines)
	what  string    // what runs now, when the caller says (note)
	done  time.Duration
	total time.Duration
	// The fraction shown never goes back when the total grows (a plan
	// adds work when its cheapest candidates miss): it is anchored where
	// the total last changed, at fraction0 with done0 done, and the work
	// left then fills the rest.
	fraction0 float64
	done0     time.Duration
}

// progressConfig says where and how progress goes.
type progressConfig struct {
	// bar: draw the bar on a terminal; lines: write the lines elsewhere.
	bar, lines bool
	stderr     io.Writer
	terminal   func() bool // nil: whether stderr is a character device
	desc       string      // "simulating"
	throttle   time.Duration
	every      time.Duration    // between two lines; 0: progressLineEvery
	now        func() time.Time // nil: time.Now
}

// progressLineEvery is the wall time between two progress lines.
const progressLineEvery = 5 * time.Second

// newProgress returns the bar on a terminal (when c.bar), the lines
// elsewhere (when c.lines), or nil: nothing to show.
func newProgress(c progressConfig) *progress {
	if c.stderr == nil {
		return nil
	}
	if c.terminal == nil {
		c.terminal = func() bool { return isTerminal(c.stderr) }
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.every <= 0 {
		c.every = progressLineEvery
	}
	p := &progress{w: c.stderr, desc: c.desc, every: c.every, now: c.now}
	p.start, p.last = p.now(), p.now()
	switch term := c.terminal(); {
	case term && c.bar:
		p.bar = progressbar.NewOptions64(1,
			progressbar.OptionSetWriter(c.stderr),
			progressbar.OptionSetDescription(c.desc),
			// The bar's own clock starts at its first render and is reset
			// by some of its calls: the description tells ours instead.
			progressbar.OptionSetElapsedTime(false),
			progressbar.OptionSetPredictTime(false),
			progressbar.OptionThrottle(c.throttle),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionSetWidth(30),
		)
	case !term && c.lines:
	default:
		return nil
	}
	return p
}

// set is the progress callback of sim, planner and bench: done of total
// (simulated or target time). Calls may come from several goroutines.
func (p *progress) set(done, total time.Duration) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if total != p.total {
		p.fraction0, p.done0 = p.fraction(), p.done
	}
	p.done, p.total = done, total
	now := p.now()
	if p.bar != nil {
		if p.bar.GetMax64() != barSteps {
			p.bar.ChangeMax64(barSteps)
		}
		p.bar.Describe(p.desc + " " + p.clock(now))
		_ = p.bar.Set64(int64(p.fraction() * barSteps))
		return
	}
	if now.Sub(p.last) < p.every {
		return
	}
	p.last = now
	p.line(now)
}

// barSteps is the bar's resolution: it shows the fraction, in thousandths.
const barSteps = 1000

// fraction is the share of the work done, 0 to 1, as shown: from the
// anchor where the total last changed, the work done since over the work
// that was left then. It never decreases while done does not.
func (p *progress) fraction() float64 {
	left := p.total - p.done0
	if left <= 0 {
		if p.total > 0 && p.done >= p.total {
			return 1
		}
		return p.fraction0
	}
	f := p.fraction0 + (1-p.fraction0)*float64(p.done-p.done0)/float64(left)
	return min(max(f, p.fraction0), 1)
}

// note says what runs now (a candidate, its routing, a band member and
// its levels); the next line names it.
func (p *progress) note(what string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.what = what
	p.mu.Unlock()
}

// clock is "1m41s elapsed, about 20s left" (no estimate before any work
// is done).
func (p *progress) clock(now time.Time) string {
	elapsed := now.Sub(p.start)
	s := round(elapsed) + " elapsed"
	if p.done > 0 && p.total >= p.done {
		left := time.Duration(float64(elapsed) * float64(p.total-p.done) / float64(p.done))
		s += ", about " + round(left) + " left"
	}
	return s
}

// line writes one line: "simulating: 42% (1h12m0s of 2h51m0s simulated),
// 1m41s elapsed, about 2m19s left; now 16 x H100 SXM, affinity ...".
func (p *progress) line(now time.Time) {
	pct := 100 * p.fraction()
	s := fmt.Sprintf("%s: %.0f%% (%s of %s simulated), %s", p.desc, pct, round(p.done), round(p.total), p.clock(now))
	if p.what != "" {
		s += "; now " + p.what
	}
	fmt.Fprintln(p.w, s)
}

// finish clears the bar; lines end with none.
func (p *progress) finish() {
	if p == nil || p.bar == nil {
		return
	}
	_ = p.bar.Finish()
}

// round is d to the second (to the tenth below ten seconds).
func round(d time.Duration) string {
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
