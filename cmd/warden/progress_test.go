package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSimProgressLines checks that a sim whose stderr is not a terminal
// writes progress lines (here one at every update: progressEvery is
// tiny), and none with --quiet or --progress=false given.
func TestSimProgressLines(t *testing.T) {
	line := regexp.MustCompile(`^simulating: \d+% \(\S+ of 1m0s simulated\), \S+ elapsed(, about \S+ left)?$`)
	for _, tt := range []struct {
		name      string
		quiet     bool
		noProg    bool // --progress=false given
		wantLines bool
	}{
		{name: "default", wantLines: true},
		{name: "--quiet", quiet: true},
		{name: "--progress=false", noProg: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stderr, stdout bytes.Buffer
			o := &simOptions{Sessions: []int{4}, Duration: 30 * time.Second, MaxSimTime: defaultMaxSimTime, Strategies: []string{"least-loaded", "affinity"},
				Quiet: tt.quiet, stderr: &stderr, isTerminal: func() bool { return false }, progressEvery: time.Nanosecond,
				changed: func(name string) bool { return tt.noProg && name == "progress" }}
			if err := runSim(context.Background(), o, &stdout); err != nil {
				t.Fatal(err)
			}
			out := stderr.String()
			if !tt.wantLines {
				if out != "" {
					t.Errorf("wrote %.200q to stderr", out)
				}
				return
			}
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			if len(lines) < 3 {
				t.Fatalf("%d progress lines: %q", len(lines), out)
			}
			for _, l := range lines {
				if !line.MatchString(l) {
					t.Errorf("progress line %q", l)
				}
			}
		})
	}
}

// fakeClock is a wall clock that tests move.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// TestProgressClockIsTheWallClock checks that the bar and the lines tell
// the wall time since the run started, and an estimate left from it: a
// run of 101 s at 99 % reads 1m41s, not the bar library's own clock (which
// read 13 s there).
func TestProgressClockIsTheWallClock(t *testing.T) {
	for _, term := range []bool{true, false} {
		clock := &fakeClock{t: time.Unix(1000, 0)}
		var stderr bytes.Buffer
		p := newProgress(progressConfig{bar: true, lines: true, stderr: &stderr, terminal: func() bool { return term },
			desc: "simulating", every: time.Second, now: clock.now})
		total := 100 * time.Minute
		for s := range 101 {
			clock.t = clock.t.Add(time.Second)
			p.set(time.Duration(float64(total)*float64(s+1)/102), total)
		}
		p.set(99*time.Minute, total)
		out := stderr.String()
		// 99 of 100 minutes simulated in 101 s: about 1 s left.
		if want := "1m41s elapsed, about 1s left"; !strings.Contains(out, want) {
			t.Errorf("terminal %v: %q does not end with %q", term, out[max(0, len(out)-300):], want)
		}
		if !term && strings.Count(out, "\n") != 101 {
			t.Errorf("%d lines for 101 s at one a second", strings.Count(out, "\n"))
		}
		p.finish()
	}
}

// TestProgressNeverBackwards: a plan's total grows when its cheapest
// candidates miss and dearer ones are simulated; the percentage shown
// must not run backwards (it went from 97 % to 49 %), and it reaches 100
// % when the work is done.
func TestProgressNeverBackwards(t *testing.T) {
	var stderr bytes.Buffer
	clk := &fakeClock{t: time.Unix(1e9, 0)}
	p := newProgress(progressConfig{lines: true, stderr: &stderr, terminal: func() bool { return false }, desc: "simulating", every: time.Nanosecond, now: clk.now})
	m := time.Minute
	for _, u := range []struct{ done, total time.Duration }{
		{0, 100 * m}, {50 * m, 100 * m}, {97 * m, 100 * m}, {97 * m, 200 * m}, {100 * m, 200 * m}, {150 * m, 200 * m},
		{150 * m, 300 * m}, {299 * m, 300 * m}, {300 * m, 300 * m},
	} {
		clk.t = clk.t.Add(time.Second)
		p.set(u.done, u.total)
	}
	pct := regexp.MustCompile(`^simulating: (\d+)%`)
	last := -1
	var shown []int
	for l := range strings.Lines(stderr.String()) {
		m := pct.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("line %q", l)
		}
		n, _ := strconv.Atoi(m[1])
		shown = append(shown, n)
		if n < last {
			t.Errorf("%d %% after %d %%: backwards (%v)", n, last, shown)
		}
		last = n
	}
	if last != 100 || shown[2] != 97 || shown[3] != 97 {
		t.Errorf("shown %v: want 97 %% kept when the total doubles and 100 %% at the end", shown)
	}
}
