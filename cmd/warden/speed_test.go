package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lm-warden/warden/live"
)

// TestSpeed is the open-loop benchmark of issue 13, item 12: what the
// proxy adds to a request's latency, and the CPU it burns per request,
// beside HAProxy 2.6 (Debian's /usr/sbin/haproxy, `balance
// hdr(X-Claude-Code-Session-Id)`) on the same backends.
//
// Setup: 4 fake vLLM backends on loopback (in this process: read the body,
// answer a small chat.completion JSON at once); an open-loop generator at
// WARDEN_SPEED_RATE requests/s (default 1,000) for WARDEN_SPEED_DURATION
// (default 5s) after a 2 s warm-up, each request sent at its scheduled
// time whatever the others do and its latency measured from that time
// (so queueing anywhere, the generator's included, is not hidden:
// coordinated omission); bodies of 64 KiB and 256 KiB, non-streamed chat
// requests of 64 sessions, each with its X-Claude-Code-Session-Id. The
// targets in turn for each size: the backends directly (the baseline; a
// session goes to backend session mod 4), HAProxy (the goal's reference,
// which streams the body to the server it picked by the header),
// haproxy-body (the same waiting for the whole body first, as a proxy
// that routes by the body must: see startHAProxy), Go's bare
// httputil.ReverseProxy (testdata/speedfloor: the floor of any proxy on
// net/http), go-raw (testdata/speedraw: a relay on bare connections that
// reads each body whole first, as warden must, and does nothing else: the
// floor of any Go proxy that routes by the body), go-http (the same relay
// behind net/http's server: what that server adds to it), go-cut (the
// same relay sending the body on as it comes, as HAProxy does: what a Go
// proxy that could route before the body is whole would get), and the
// warden binary (`warden proxy`, built from this tree or WARDEN_BIN), and with WARDEN_SPEED_BASE=BINARY a second warden
// (warden-base, e.g. main's build) for an A/B in the same runs, paired
// as warden is with HAProxy. Added p50/p99 are
// the target's minus the baseline's; CPU per request is the utime+stime
// of the proxy's process (/proc/PID/stat) over the measured window divided
// by its requests, and cs/req its threads' context switches
// (/proc/PID/task/*/status) likewise: on a virtual machine a switch costs
// tens of µs, and they are where a Go proxy's CPU beyond HAProxy's goes.
//
// Each figure is the median of WARDEN_SPEED_RUNS runs (default 6), the
// targets measured in turn within a run; each target's difference from
// HAProxy is paired run by run, with a confidence interval of its median
// (pairedVerdict), since the runs of a shared machine drift by more than
// the differences sought: many short runs tell two proxies apart where a
// few long ones do not. To look closer:
// WARDEN_SPEED_TARGETS (e.g. "haproxy,warden"; direct
// always runs) and WARDEN_SPEED_SIZES (KiB, e.g. "64") narrow the run,
// WARDEN_SPEED_GOMAXPROCS fixes the Go proxies' GOMAXPROCS (warden's
// default is --procs auto) and WARDEN_SPEED_GODEBUG their GODEBUG (e.g.
// gctrace=1), WARDEN_SPEED_BODY=code fills the bodies with escaped source
// code instead of prose, WARDEN_SPEED_LOGS=DIR keeps each proxy's output there, and
// WARDEN_SPEED_PERF=DIR records a perf(1) profile of each target over its
// window (perf adds its own CPU), and WARDEN_SPEED_SPLIT=1 splits each
// target's latency by direction (splitTimes): where a proxy's time goes,
// on the way in or on the way back.
//
// It measures, it does not judge (the numbers depend on the machine and on
// what else runs there), so it runs only with WARDEN_SPEED=1: `make speed`.
// It fails if a request fails. Without HAProxy its rows say so and the
// rest runs.
func TestSpeed(t *testing.T) {
	if os.Getenv("WARDEN_SPEED") != "1" {
		t.Skip("the proxy overhead benchmark runs with WARDEN_SPEED=1 (make speed)")
	}
	rate := envFloat(t, "WARDEN_SPEED_RATE", 1000)
	dur := envDuration(t, "WARDEN_SPEED_DURATION", 5*time.Second)
	kind := cmp.Or(os.Getenv("WARDEN_SPEED_BODY"), "prose")
	if _, ok := speedFillers[kind]; !ok {
		t.Fatalf("WARDEN_SPEED_BODY=%q: want one of %s", kind, strings.Join(slices.Sorted(maps.Keys(speedFillers)), ", "))
	}
	sizes, err := speedSizes(os.Getenv("WARDEN_SPEED_SIZES"))
	if err != nil {
		t.Fatal(err)
	}
	const warm, sessions = 2 * time.Second, 64

	var split *splitTimes
	if os.Getenv("WARDEN_SPEED_SPLIT") == "1" {
		split = &splitTimes{}
	}
	var backends []string
	for range 4 {
		backends = append(backends, startSpeedBackend(t, split))
	}
	bin := os.Getenv("WARDEN_BIN")
	if bin == "" {
		bin = filepath.Join(t.TempDir(), "warden")
		if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
	}
	warden := startWardenProxy(t, "warden", bin, backends)
	var wardenBase *speedTarget
	if base := os.Getenv("WARDEN_SPEED_BASE"); base != "" {
		wardenBase = startWardenProxy(t, "warden-base", base, backends)
	}
	floor := startFloorProxy(t, "go-floor", "speedfloor", backends)
	raw := startFloorProxy(t, "go-raw", "speedraw", backends)
	rawHTTP := startFloorProxy(t, "go-http", "speedraw", backends, "-http")
	cut := startFloorProxy(t, "go-cut", "speedraw", backends, "-cut")
	const haproxyPath = "/usr/sbin/haproxy"
	var haproxy, haproxyBody *speedTarget
	if _, err := os.Stat(haproxyPath); err != nil {
		t.Logf("HAProxy absent (%s: %v): its rows are skipped; apt-get install haproxy for the reference", haproxyPath, err)
	} else {
		haproxy = startHAProxy(t, "haproxy", haproxyPath, backends, false)
		haproxyBody = startHAProxy(t, "haproxy-body", haproxyPath, backends, true)
	}

	var rows []speedRow
	var verdicts, splitRows []string
	only := os.Getenv("WARDEN_SPEED_TARGETS") // comma-separated names; direct always runs
	runs := int(envFloat(t, "WARDEN_SPEED_RUNS", minVerdictRuns))
	for _, size := range sizes {
		bodies := speedBodies(sessions, size, kind)
		targets := []*speedTarget{{name: "direct", url: func(s int) string { return backends[s%len(backends)] }}}
		if haproxy != nil {
			targets = append(targets, haproxy, haproxyBody)
		}
		targets = append(targets, floor, raw, rawHTTP, cut, warden)
		if wardenBase != nil {
			targets = append(targets, wardenBase)
		}
		targets = slices.DeleteFunc(targets, func(tg *speedTarget) bool {
			return only != "" && tg.name != "direct" && !slices.Contains(strings.Split(only, ","), tg.name)
		})
		// Each run measures every target in turn, so that what drifts on
		// the machine meanwhile falls on all of them; a row is the median
		// run of each figure.
		got := make([][]speedRow, len(targets))
		splits := make([][][numSplit]float64, len(targets))
		for run := range runs {
			for _, i := range runOrder(len(targets), run) {
				tg := targets[i]
				openLoop(t, tg, bodies, rate, warm, split) // warm-up, discarded
				var stopPerf func()
				if run == 0 {
					stopPerf = perfRecord(t, tg, size)
				}
				split.reset()
				c0, s0 := tg.cpu(t), tg.switches(t)
				res := openLoop(t, tg, bodies, rate, dur, split)
				c1, s1 := tg.cpu(t), tg.switches(t)
				if split != nil {
					splits[i] = append(splits[i], split.medians())
				}
				if stopPerf != nil {
					stopPerf()
				}
				cpu, cs := -1.0, -1.0
				if tg.pid > 0 {
					cpu = float64(c1-c0) / float64(res.n) * 1e6
					cs = float64(s1-s0) / float64(res.n)
				}
				r := speedRow{size: fmt.Sprintf("%d KiB", size>>10), target: tg.name, n: res.n, errs: res.errs,
					p50: quantileMS(res.lat, 0.5), p99: quantileMS(res.lat, 0.99), cpuUS: cpu, switches: cs}
				got[i] = append(got[i], r)
				if res.errs > 0 {
					t.Errorf("%s %s: %d of %d requests failed, first: %v", r.size, r.target, res.errs, res.n, res.firstErr)
				}
			}
		}
		for _, rs := range got {
			rows = append(rows, medianRow(rs))
		}
		if split != nil {
			for i, tg := range targets {
				splitRows = append(splitRows, splitRow(fmt.Sprintf("%d KiB", size>>10), tg.name, splits[i]))
			}
		}
		if h := slices.IndexFunc(targets, func(tg *speedTarget) bool { return tg.name == "haproxy" }); h >= 0 {
			for i, tg := range targets {
				if tg.name != "direct" && tg.name != "haproxy" {
					verdicts = append(verdicts, pairedVerdict(fmt.Sprintf("%d KiB", size>>10), tg.name, "haproxy", got[i], got[h]))
				}
			}
		}
		w := slices.IndexFunc(targets, func(tg *speedTarget) bool { return tg.name == "warden" })
		if b := slices.IndexFunc(targets, func(tg *speedTarget) bool { return tg.name == "warden-base" }); b >= 0 && w >= 0 {
			verdicts = append(verdicts, pairedVerdict(fmt.Sprintf("%d KiB", size>>10), "warden", "warden-base", got[w], got[b]))
		}
	}
	var b strings.Builder
	procs := fmt.Sprintf("warden --procs auto, the go-* floors Go's default (%d CPUs)", runtime.NumCPU())
	if v := os.Getenv("WARDEN_SPEED_GOMAXPROCS"); v != "" {
		procs = "GOMAXPROCS=" + v + " for warden and the go-* floors"
	}
	fmt.Fprintf(&b, "open loop %g req/s for %v, %d sessions, 4 backends on loopback, %s bodies; %s; the median of %d runs\n",
		rate, dur, sessions, kind, procs, runs)
	fmt.Fprintf(&b, "%-8s %-12s %9s %9s %10s %10s %11s %7s %8s %7s\n", "body", "target", "p50 ms", "p99 ms", "+p50 ms", "+p99 ms", "CPU µs/req", "cs/req", "requests", "failed")
	var base speedRow
	for _, r := range rows {
		if r.target == "direct" {
			base = r
		}
		add50, add99, cpu, cs := "-", "-", "-", "-"
		if r.target != "direct" {
			add50, add99 = fmt.Sprintf("%+.2f", r.p50-base.p50), fmt.Sprintf("%+.2f", r.p99-base.p99)
		}
		if r.cpuUS >= 0 {
			cpu = fmt.Sprintf("%.0f", r.cpuUS)
		}
		if r.switches >= 0 {
			cs = fmt.Sprintf("%.1f", r.switches)
		}
		fmt.Fprintf(&b, "%-8s %-12s %9.2f %9.2f %10s %10s %11s %7s %8d %7d\n", r.size, r.target, r.p50, r.p99, add50, add99, cpu, cs, r.n, r.errs)
	}
	for _, size := range []string{"64 KiB", "256 KiB"} {
		var h, w, g float64
		for _, r := range rows {
			if r.size == size && r.target == "haproxy" {
				h = r.cpuUS
			}
			if r.size == size && r.target == "warden" {
				w = r.cpuUS
			}
			if r.size == size && r.target == "go-floor" {
				g = r.cpuUS
			}
		}
		if h > 0 && w > 0 {
			fmt.Fprintf(&b, "%s: warden CPU per request = %.2fx HAProxy's", size, w/h)
			if g > 0 {
				fmt.Fprintf(&b, "; Go's bare ReverseProxy (go-floor) = %.2fx", g/h)
			}
			b.WriteString("\n")
		}
	}
	for _, v := range verdicts {
		b.WriteString(v)
	}
	if len(splitRows) > 0 {
		fmt.Fprintf(&b, "latency by direction, µs (the median over runs of each run's median; the parts need not add up to the whole):\n%-8s %-12s %6s %16s %14s %16s\n",
			"body", "target", "late", "sent->backend", "backend read", "answered->client")
		for _, r := range splitRows {
			b.WriteString(r)
		}
	}
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Fprintf(&b, "load average at the end: %s", la)
	}
	t.Log("\n" + b.String())
	if out := os.Getenv("WARDEN_SPEED_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// splitTimes splits the latency of each request by direction
// (WARDEN_SPEED_SPLIT=1): the client stamps the time it sends a request
// (splitSentHeader), the backend notes when its handler starts and when
// it has read the body, and stamps the time it answers
// (splitAnsweredHeader), which the client subtracts from the time it has
// the whole answer. The client and the backends are this process, one
// clock; the proxies pass both headers on.
type splitTimes struct {
	mu sync.Mutex
	v  [numSplit][]float64 // µs
}

const (
	splitSentHeader     = "X-Warden-Speed-Sent"
	splitAnsweredHeader = "X-Warden-Speed-Answered"
)

// The parts: how late the client sent the request (its goroutine's start,
// the same for every target unless the machine starves the client), the
// request's way to the backend's handler (the proxy's reading, routing and
// sending, and the backend's accepting it), the backend's reading of the
// body (shorter when it came before the handler started), the answer's
// way back.
const (
	splitLate = iota
	splitIn
	splitBody
	splitBack
	numSplit
)

func (s *splitTimes) reset() {
	if s != nil {
		s.mu.Lock()
		s.v = [numSplit][]float64{}
		s.mu.Unlock()
	}
}

func (s *splitTimes) add(k int, d time.Duration) {
	s.mu.Lock()
	s.v[k] = append(s.v[k], float64(d)/1e3)
	s.mu.Unlock()
}

// received notes a request whose handler started at arrived and has read
// the body now; sent is the client's stamp.
func (s *splitTimes) received(sent string, arrived time.Time) {
	if ns, err := strconv.ParseInt(sent, 10, 64); err == nil {
		s.add(splitIn, arrived.Sub(time.Unix(0, ns)))
		s.add(splitBody, time.Since(arrived))
	}
}

// answered notes an answer the client has whole now; stamp is the
// backend's (none: a proxy that did not pass it on).
func (s *splitTimes) answered(stamp string) {
	if s == nil {
		return
	}
	if ns, err := strconv.ParseInt(stamp, 10, 64); err == nil {
		s.add(splitBack, time.Since(time.Unix(0, ns)))
	}
}

// medians are the median of each part since the last reset, -1 for a part
// with no samples.
func (s *splitTimes) medians() [numSplit]float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var m [numSplit]float64
	for k, v := range s.v {
		m[k] = -1
		if len(v) > 0 {
			m[k] = median(v)
		}
	}
	return m
}

// splitRow is one target's line of the split table: the median over runs
// of each part's median.
func splitRow(size, target string, runs [][numSplit]float64) string {
	cells := make([]string, numSplit)
	for k := range numSplit {
		var v []float64
		for _, r := range runs {
			if r[k] >= 0 {
				v = append(v, r[k])
			}
		}
		cells[k] = "-"
		if len(v) > 0 {
			cells[k] = fmt.Sprintf("%.0f", median(v))
		}
	}
	return fmt.Sprintf("%-8s %-12s %6s %16s %14s %16s\n", size, target, cells[splitLate], cells[splitIn], cells[splitBody], cells[splitBack])
}

// runOrder is the order in which run measures n targets: direct (0)
// first, the others in turn, reversed on every other run, so that a
// drift of the machine within a run (or a target that measures better
// for coming after another) falls on each side of a comparison alike.
func runOrder(n, run int) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	if run%2 == 1 && n > 2 {
		slices.Reverse(order[1:])
	}
	return order
}

// pairedVerdict compares a target (name, its runs ws) with HAProxy run by
// run (ws[i] and hs[i] were measured in the same run, one after the
// other, against the same backends): the median difference of p50 and of
// p99, its range and in how many runs the target was no worse, and the
// median CPU ratio; for warden, whether the medians meet issue 13's goal
// (p50 and p99 no worse than HAProxy's, CPU per request at most 1.5x).
// Subtracting the same direct baseline from both leaves the difference of
// the added latencies unchanged, so it is the difference of the raw ones.
func pairedVerdict(size, name, ref string, ws, hs []speedRow) string {
	n := min(len(ws), len(hs))
	d50, d99, ratio := make([]float64, n), make([]float64, n), make([]float64, 0, n)
	ahead50, ahead99 := 0, 0
	for i := range n {
		d50[i], d99[i] = ws[i].p50-hs[i].p50, ws[i].p99-hs[i].p99
		if d50[i] <= 0 {
			ahead50++
		}
		if d99[i] <= 0 {
			ahead99++
		}
		if hs[i].cpuUS > 0 && ws[i].cpuUS >= 0 {
			ratio = append(ratio, ws[i].cpuUS/hs[i].cpuUS)
		}
	}
	for _, v := range [][]float64{d50, d99, ratio} {
		slices.Sort(v)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s, %s - %s over %d runs (median, range, runs no worse): p50 %+.2f ms (%+.2f..%+.2f, %d of %d), p99 %+.2f ms (%+.2f..%+.2f, %d of %d)",
		size, name, ref, n, median(d50), d50[0], d50[n-1], ahead50, n, median(d99), d99[0], d99[n-1], ahead99, n)
	cpuOK := true
	if len(ratio) > 0 {
		fmt.Fprintf(&b, ", CPU %.2fx (%.2f..%.2f)", median(ratio), ratio[0], ratio[len(ratio)-1])
		cpuOK = median(ratio) <= 1.5
	}
	lo50, hi50, conf := medianCI(d50)
	lo99, hi99, _ := medianCI(d99)
	if conf > 0 {
		fmt.Fprintf(&b, "; %.0f %% CI of the median difference: p50 %+.2f..%+.2f ms (%s), p99 %+.2f..%+.2f ms (%s)",
			100*conf, lo50, hi50, ciWord(lo50, hi50), lo99, hi99, ciWord(lo99, hi99))
	}
	// The goal: p50 and p99 no worse, CPU within 1.5x. Met takes the
	// medians of the differences at or under zero, with neither interval
	// above it; an interval above zero is not met; medians over zero whose
	// intervals hold zero show nothing either way (a few noisy runs must
	// not pass for no worse).
	if name == "warden" && ref == "haproxy" {
		switch {
		case conf == 0:
			fmt.Fprintf(&b, "; too few runs for a verdict (%d, want %d: WARDEN_SPEED_RUNS)", n, minVerdictRuns)
		case lo50 > 0 || lo99 > 0 || !cpuOK:
			b.WriteString("; goal not met")
		case median(d50) <= 0 && median(d99) <= 0:
			b.WriteString("; goal met")
		default:
			b.WriteString("; goal not shown: a median over zero, its interval holding zero (more runs tell)")
		}
	}
	b.WriteString("\n")
	return b.String()
}

// minVerdictRuns is the fewest paired runs whose median difference has a
// confidence interval of at least 95 % (medianCI).
const minVerdictRuns = 6

// medianCI is a distribution-free confidence interval for the median of
// the population that sorted (paired differences, one a run) was drawn
// from: the k-th smallest and k-th largest values, with the largest k
// whose coverage, 1 - 2 P(Binomial(n, 1/2) < k), is at least 95 %.
// conf is that coverage, 0 when n < minVerdictRuns (no k reaches 95 %).
// Runs on a shared machine drift (its load, its caches, the host's other
// tenants), so their differences scatter by more than any one run's
// sampling error: the interval, not the median alone, says whether the
// runs tell two proxies apart.
func medianCI(sorted []float64) (lo, hi, conf float64) {
	n := len(sorted)
	// cdf[j] = P(Binomial(n, 1/2) <= j)
	pmf, cdf := math.Pow(0.5, float64(n)), 0.0
	best := 0
	for k := 1; k <= n/2; k++ {
		cdf += pmf // P(X <= k-1)
		pmf *= float64(n-(k-1)) / float64(k)
		if c := 1 - 2*cdf; c >= 0.95 {
			best, conf = k, c
		} else {
			break
		}
	}
	if best == 0 {
		return 0, 0, 0
	}
	return sorted[best-1], sorted[n-best], conf
}

// ciWord says what an interval of a difference (target minus reference)
// shows.
func ciWord(lo, hi float64) string {
	switch {
	case lo > 0:
		return "worse"
	case hi < 0:
		return "better"
	}
	return "no measurable difference"
}

// speedRow is one target at one body size.
type speedRow struct {
	size, target    string
	p50, p99, cpuUS float64 // ms, ms, µs per request (-1: none)
	switches        float64 // context switches per request (-1: none)
	n, errs         int     // requests and failures, over all runs in a median row
}

// median sorts v (not empty) and returns its middle value, the upper one
// of an even count: a value one of the runs measured.
func median(v []float64) float64 {
	slices.Sort(v)
	return v[len(v)/2]
}

// medianRow is the median of each figure over the runs rs of one target.
func medianRow(rs []speedRow) speedRow {
	med := func(f func(speedRow) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		return median(v)
	}
	m := rs[0]
	m.p50 = med(func(r speedRow) float64 { return r.p50 })
	m.p99 = med(func(r speedRow) float64 { return r.p99 })
	m.cpuUS = med(func(r speedRow) float64 { return r.cpuUS })
	m.switches = med(func(r speedRow) float64 { return r.switches })
	m.n, m.errs = 0, 0
	for _, r := range rs {
		m.n += r.n
		m.errs += r.errs
	}
	return m
}

// speedTarget is where the generator sends: a URL per session, and the
// process whose CPU is counted (pid 0: none).
type speedTarget struct {
	name string
	url  func(session int) string
	pid  int
}

// switches returns the context switches of the process's threads so far
// (voluntary and not, from /proc/PID/task/*/status; a thread that has
// exited is not counted, so a window's difference is a floor), 0 when
// there is no process.
func (s *speedTarget) switches(t *testing.T) int64 {
	if s.pid == 0 {
		return 0
	}
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", s.pid))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("%s: no threads in /proc: %v", s.name, err)
	}
	var n int64
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the thread exited meanwhile
		}
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && (k == "voluntary_ctxt_switches" || k == "nonvoluntary_ctxt_switches") {
				c, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				n += c
			}
		}
	}
	return n
}

// cpu returns the process's user+system CPU so far, in seconds (0 when
// there is no process).
func (s *speedTarget) cpu(t *testing.T) float64 {
	if s.pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.pid))
	if err != nil {
		t.Fatalf("%s: %v", s.name, err)
	}
	// Fields after the command name "(...)": state is field 3, utime 14, stime 15.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("%s: /proc/%d/stat: %q", s.name, s.pid, b)
	}
	return float64(ut+st) / clockTicks
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on Linux
// whatever the kernel's HZ.
const clockTicks = 100

// perfRecord profiles tg's process with perf(1) over the measured window
// when WARDEN_SPEED_PERF names a folder (perf record -g, one file per
// target and size, for perf report); it returns what stops it.
func perfRecord(t *testing.T, tg *speedTarget, size int) func() {
	t.Helper()
	dir := os.Getenv("WARDEN_SPEED_PERF")
	if dir == "" || tg.pid <= 0 {
		return func() {}
	}
	out := filepath.Join(dir, fmt.Sprintf("%s-%dk.data", tg.name, size>>10))
	cmd := exec.Command("perf", "record", "-g", "-q", "-o", out, "-p", strconv.Itoa(tg.pid))
	if err := cmd.Start(); err != nil {
		t.Fatalf("WARDEN_SPEED_PERF: %v", err)
	}
	return func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		_ = cmd.Wait()
	}
}

func envFloat(t *testing.T, name string, def float64) float64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return f
}

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive duration such as 10s", name, v)
	}
	return d
}

// speedBody is one session's request: a non-streamed chat request of
// size bytes (a long system prompt, the session's own message).
type speedBody struct {
	session string
	body    []byte
}

// speedFillers are the prompt texts a body is filled with
// (WARDEN_SPEED_BODY): prose, with nothing to escape, and code, as a
// coding agent sends it (source and tool output: a newline, tabs and
// quotes on every line, each escaped in JSON), which costs a proxy that
// reads the body more to scan.
var speedFillers = map[string]string{
	"prose": "lorem ipsum ",
	"code":  `\tif err := run(\"step\", n); err != nil {\n\t\treturn fmt.Errorf(\"step %d: %w\", n, err)\n\t}\n`,
}

// speedBodies returns n sessions' bodies of size bytes, filled with
// speedFillers[kind] in whole copies (a cut one could end in half an
// escape) and spaces.
func speedBodies(n, size int, kind string) []speedBody {
	fill := speedFillers[kind]
	out := make([]speedBody, n)
	for i := range out {
		id := fmt.Sprintf("5e0c3a1b-%04x-4f7e-9d2a-%012x", i, i*7919)
		head := `{"model":"bench","max_tokens":1,"stream":false,"messages":[{"role":"user","content":"session ` + id + " "
		tail := `"}]}`
		pad := size - len(head) - len(tail)
		k := pad / len(fill)
		out[i] = speedBody{session: id, body: []byte(head + strings.Repeat(fill, k) + strings.Repeat(" ", pad-k*len(fill)) + tail)}
	}
	return out
}

// loadResult is one open-loop run.
type loadResult struct {
	lat      []time.Duration // from the scheduled send time to the end of the body
	n, errs  int
	firstErr error
}

// openLoop sends rate requests per second for dur, request i at start +
// i/rate (whenever the others end), session i mod len(bodies).
func openLoop(t *testing.T, tg *speedTarget, bodies []speedBody, rate float64, dur time.Duration, split *splitTimes) loadResult {
	t.Helper()
	tr := &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, IdleConnTimeout: time.Minute, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	n := int(rate * dur.Seconds())
	res := loadResult{lat: make([]time.Duration, n), n: n}
	errs := make([]error, n)
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) / rate)
	pace := newPacer()
	defer pace.stop()
	start := time.Now()
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		pace.until(at)
		s := i % len(bodies)
		wg.Go(func() {
			req, err := http.NewRequest(http.MethodPost, tg.url(s)+"/v1/chat/completions", bytes.NewReader(bodies[s].body))
			if err != nil {
				errs[i] = err
				return
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Claude-Code-Session-Id", bodies[s].session)
			if split != nil {
				now := time.Now()
				split.add(splitLate, now.Sub(at))
				req.Header.Set(splitSentHeader, strconv.FormatInt(now.UnixNano(), 10))
			}
			resp, err := client.Do(req)
			if err != nil {
				errs[i] = err
				return
			}
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			res.lat[i] = time.Since(at)
			split.answered(resp.Header.Get(splitAnsweredHeader))
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			if res.errs == 0 {
				res.firstErr = err
			}
			res.errs++
		}
	}
	return res
}

func quantileMS(lat []time.Duration, q float64) float64 {
	s := slices.Clone(lat)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return float64(s[min(int(q*float64(len(s))), len(s)-1)]) / 1e6
}

// startSpeedBackend serves a fake vLLM that answers every inference
// request at once (the body read whole, a small chat.completion) and the
// /health and /metrics pages the proxy probes; it returns its URL.
func startSpeedBackend(t *testing.T, split *splitTimes) string {
	t.Helper()
	const answer = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"length"}],"usage":{"prompt_tokens":16384,"completion_tokens":1,"total_tokens":16385}}`
	const metrics = "vllm:num_requests_running{engine=\"0\",model_name=\"bench\"} 0\n" +
		"vllm:num_requests_waiting{engine=\"0\",model_name=\"bench\"} 0\n" +
		"vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"bench\"} 0\n"
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = io.WriteString(w, metrics)
	})
	mux.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		arrived := time.Now()
		_, _ = io.Copy(io.Discard, r.Body)
		if split != nil {
			split.received(r.Header.Get(splitSentHeader), arrived)
			w.Header().Set(splitAnsweredHeader, strconv.FormatInt(time.Now().UnixNano(), 10))
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
		_, _ = io.WriteString(w, answer)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { _ = srv.Serve(ln); close(done) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return "http://" + ln.Addr().String()
}

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startProcess runs a server process until the test ends (SIGTERM, then
// the wait) and waits until url answers 200 to a chat request.
func startProcess(t *testing.T, name string, url string, argv ...string) *speedTarget {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	if !strings.HasPrefix(name, "haproxy") { // the Go proxies' only, not this process's
		if v := os.Getenv("WARDEN_SPEED_GOMAXPROCS"); v != "" {
			cmd.Env = append(os.Environ(), "GOMAXPROCS="+v)
		}
		if v := os.Getenv("WARDEN_SPEED_GODEBUG"); v != "" {
			cmd.Env = append(cmd.Environ(), "GODEBUG="+v)
		}
	}
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	exited := make(chan struct{}) // closed when the process is gone; then waitErr is set
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if dir := os.Getenv("WARDEN_SPEED_LOGS"); dir != "" {
			_ = os.WriteFile(filepath.Join(dir, name+".log"), stderr.Bytes(), 0o644)
		}
	})
	body := speedBodies(1, 1024, "prose")[0]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body.body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Claude-Code-Session-Id", body.session)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		select {
		case <-exited:
			t.Fatalf("%s exited: %v\n%s", name, waitErr, stderr.String())
		case <-ctx.Done():
			t.Fatalf("%s does not answer at %s: %v\n%s", name, url, err, stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	http.DefaultClient.CloseIdleConnections()
	return &speedTarget{name: name, url: func(int) string { return url }, pid: cmd.Process.Pid}
}

func startWardenProxy(t *testing.T, name, bin string, backends []string) *speedTarget {
	t.Helper()
	listen, admin := freeAddr(t), freeAddr(t)
	cfg := fmt.Sprintf("listen: %s\nadmin: %s\nauth: passthrough\ntimeouts: {drain: 2s}\nmodels:\n  - name: bench\n    max_num_seqs: 256\n    replicas: [%s]\n",
		listen, admin, strings.Join(backends, ", "))
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return startProcess(t, name, "http://"+listen, bin, "proxy", "--config", path, "--log-level", "warn")
}

// startFloorProxy runs one of the floors, built from testdata/DIR:
// speedfloor (go-floor), Go's httputil.ReverseProxy and nothing else, the
// floor of any proxy written on net/http; speedraw (go-raw), a
// store-and-forward relay on bare connections, the floor of any Go proxy
// that reads the body before it routes.
func startFloorProxy(t *testing.T, name, dir string, backends []string, flags ...string) *speedTarget {
	t.Helper()
	bin := filepath.Join(t.TempDir(), dir)
	if out, err := exec.Command("go", "build", "-o", bin, "./testdata/"+dir).CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", dir, err, out)
	}
	listen := freeAddr(t)
	return startProcess(t, name, "http://"+listen, slices.Concat([]string{bin}, flags, []string{listen}, backends)...)
}

// startHAProxy runs the reference: HAProxy balancing on the session
// header. wholeBody makes it wait for the whole request body before it
// picks a server and forwards a byte (option http-buffer-request, with
// buffers that hold a 256 KiB body), as any proxy that routes by the body
// must: the row that shows what reading the body first costs, apart from
// the rest of what a proxy does.
func startHAProxy(t *testing.T, name, bin string, backends []string, wholeBody bool) *speedTarget {
	t.Helper()
	listen := freeAddr(t)
	var servers strings.Builder
	for i, b := range backends {
		fmt.Fprintf(&servers, "  server b%d %s\n", i, strings.TrimPrefix(b, "http://"))
	}
	global, buffer := "", ""
	if wholeBody {
		global, buffer = "  tune.bufsize 327680\n", "  option http-buffer-request\n"
	}
	cfg := "global\n  maxconn 4096\n" + global + "\ndefaults\n  mode http\n  timeout connect 2s\n  timeout client 60s\n  timeout server 60s\n" +
		"  option http-keep-alive\n  http-reuse safe\n" + buffer + "\nfrontend fe\n  bind " + listen + "\n  default_backend be\n\n" +
		"backend be\n  balance hdr(X-Claude-Code-Session-Id)\n" + servers.String()
	path := filepath.Join(t.TempDir(), name+".cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return startProcess(t, name, "http://"+listen, bin, "-f", path, "-db")
}

// speedSizes reads WARDEN_SPEED_SIZES, body sizes in KiB, comma-separated
// (empty: 64 and 256 KiB). A size over warden's default body limit is
// refused before any server starts: warden would answer every request
// 413, and the run's 64 bodies of it would be held in memory at once.
func speedSizes(v string) ([]int, error) {
	if v == "" {
		return []int{64 << 10, 256 << 10}, nil
	}
	var sizes []int
	for f := range strings.SplitSeq(v, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || k <= 0 {
			return nil, fmt.Errorf("WARDEN_SPEED_SIZES=%q: %q is not a size in KiB", v, f)
		}
		if k > live.DefaultMaxBodyBytes>>10 {
			return nil, fmt.Errorf("WARDEN_SPEED_SIZES=%q: %d KiB is over warden's body limit of %d KiB (limits.max_body_bytes)", v, k, live.DefaultMaxBodyBytes>>10)
		}
		sizes = append(sizes, k<<10)
	}
	return sizes, nil
}

func TestSpeedSizes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
		err  string
	}{
		{"", []int{64 << 10, 256 << 10}, ""},
		{"64", []int{64 << 10}, ""},
		{" 1, 16384", []int{1 << 10, 16 << 20}, ""},
		{"0", nil, `"0" is not a size in KiB`},
		{"64,x", nil, `"x" is not a size in KiB`},
		{"262144", nil, "262144 KiB is over warden's body limit of 16384 KiB"},
	} {
		got, err := speedSizes(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("speedSizes(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("speedSizes(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

// TestSpeedBodies: every body is one valid chat request of exactly the
// size asked, whatever the filler, so that the sizes compared are the
// sizes sent and no proxy refuses one.
func TestSpeedBodies(t *testing.T) {
	for kind := range speedFillers {
		for _, size := range []int{1 << 10, 64<<10 + 7, 256 << 10} {
			for _, b := range speedBodies(3, size, kind) {
				var req struct {
					Model    string
					Messages []struct{ Content string }
				}
				if err := json.Unmarshal(b.body, &req); err != nil {
					t.Fatalf("%s, %d bytes: %v", kind, size, err)
				}
				if len(b.body) != size || req.Model != "bench" || len(req.Messages) != 1 || !strings.Contains(req.Messages[0].Content, b.session) {
					t.Errorf("%s: %d bytes (want %d), model %q, %d messages", kind, len(b.body), size, req.Model, len(req.Messages))
				}
			}
		}
	}
}

func TestRunOrder(t *testing.T) {
	tests := []struct {
		n, run int
		want   []int
	}{
		{1, 0, []int{0}},
		{2, 1, []int{0, 1}},
		{4, 0, []int{0, 1, 2, 3}},
		{4, 1, []int{0, 3, 2, 1}},
		{4, 2, []int{0, 1, 2, 3}},
	}
	for _, tt := range tests {
		if got := runOrder(tt.n, tt.run); !slices.Equal(got, tt.want) {
			t.Errorf("runOrder(%d, %d) = %v; want %v", tt.n, tt.run, got, tt.want)
		}
	}
}

func TestPairedVerdict(t *testing.T) {
	row := func(p50, p99, cpu float64) speedRow { return speedRow{p50: p50, p99: p99, cpuUS: cpu} }
	// rows makes n runs of (p50, p99, cpu), run i's p50 and p99 moved by
	// step*i, so that the differences spread.
	rows := func(n int, p50, p99, cpu, step float64) []speedRow {
		var rs []speedRow
		for i := range n {
			rs = append(rs, row(p50+step*float64(i), p99+step*float64(i), cpu))
		}
		return rs
	}
	tests := []struct {
		name   string
		target string
		ws, hs []speedRow
		want   string
	}{
		{"ahead in every run, too few runs", "warden",
			[]speedRow{row(1.0, 3.0, 150), row(1.1, 2.0, 160), row(0.9, 4.0, 140)},
			[]speedRow{row(1.1, 3.5, 100), row(1.2, 2.5, 100), row(1.0, 4.1, 100)},
			"64 KiB, warden - haproxy over 3 runs (median, range, runs no worse): p50 -0.10 ms (-0.10..-0.10, 3 of 3), p99 -0.50 ms (-0.50..-0.10, 3 of 3), CPU 1.50x (1.40..1.60); too few runs for a verdict (3, want 6: WARDEN_SPEED_RUNS)\n"},
		// The medians of the differences, not the differences of the medians:
		// warden's median p99 (3.0) is under HAProxy's (3.5), but it was
		// worse in two of three runs.
		{"paired, not medians apart", "warden",
			[]speedRow{row(1, 3.0, 100), row(1, 9.0, 100), row(1, 2.0, 100)},
			[]speedRow{row(1, 2.5, 100), row(1, 3.5, 100), row(1, 9.0, 100)},
			"64 KiB, warden - haproxy over 3 runs (median, range, runs no worse): p50 +0.00 ms (+0.00..+0.00, 3 of 3), p99 +0.50 ms (-7.00..+5.50, 1 of 3), CPU 1.00x (1.00..1.00); too few runs for a verdict (3, want 6: WARDEN_SPEED_RUNS)\n"},
		// Six runs: the interval is the range (96.9 %).
		{"better in six runs", "warden", rows(6, 1.0, 2.0, 120, 0.01), rows(6, 1.1, 2.5, 100, 0.02),
			"64 KiB, warden - haproxy over 6 runs (median, range, runs no worse): p50 -0.12 ms (-0.15..-0.10, 6 of 6), p99 -0.52 ms (-0.55..-0.50, 6 of 6), CPU 1.20x (1.20..1.20); 97 % CI of the median difference: p50 -0.15..-0.10 ms (better), p99 -0.55..-0.50 ms (better); goal met\n"},
		// Worse in most runs, but one run ahead puts 0 inside the range:
		// no measurable difference, and a median over zero: not shown.
		{"one run ahead: no measurable difference", "warden",
			append(rows(5, 1.1, 2.0, 100, 0), row(0.9, 2.0, 100)), rows(6, 1.0, 2.0, 100, 0),
			"64 KiB, warden - haproxy over 6 runs (median, range, runs no worse): p50 +0.10 ms (-0.10..+0.10, 1 of 6), p99 +0.00 ms (+0.00..+0.00, 6 of 6), CPU 1.00x (1.00..1.00); 97 % CI of the median difference: p50 -0.10..+0.10 ms (no measurable difference), p99 +0.00..+0.00 ms (no measurable difference); goal not shown: a median over zero, its interval holding zero (more runs tell)\n"},
		// Ahead in most runs, one behind: met on the medians.
		{"one run behind: met", "warden",
			append(rows(5, 0.9, 2.0, 100, 0), row(1.1, 2.0, 100)), rows(6, 1.0, 2.0, 100, 0),
			"64 KiB, warden - haproxy over 6 runs (median, range, runs no worse): p50 -0.10 ms (-0.10..+0.10, 5 of 6), p99 +0.00 ms (+0.00..+0.00, 6 of 6), CPU 1.00x (1.00..1.00); 97 % CI of the median difference: p50 -0.10..+0.10 ms (no measurable difference), p99 +0.00..+0.00 ms (no measurable difference); goal met\n"},
		// Fifteen runs: the 4th smallest and 4th largest (96.5 %); p50
		// worse in all but three runs is worse.
		{"worse in fifteen runs", "warden",
			append(rows(12, 1.05, 2.0, 100, 0.001), rows(3, 0.9, 2.0, 100, 0)...), rows(15, 1.0, 2.0, 100, 0),
			"64 KiB, warden - haproxy over 15 runs (median, range, runs no worse): p50 +0.05 ms (-0.10..+0.06, 3 of 15), p99 +0.00 ms (+0.00..+0.01, 4 of 15), CPU 1.00x (1.00..1.00); 96 % CI of the median difference: p50 +0.05..+0.06 ms (worse), p99 +0.00..+0.01 ms (no measurable difference); goal not met\n"},
		{"CPU over 1.5x", "warden", rows(6, 1, 1, 200, 0), rows(6, 2, 2, 100, 0),
			"64 KiB, warden - haproxy over 6 runs (median, range, runs no worse): p50 -1.00 ms (-1.00..-1.00, 6 of 6), p99 -1.00 ms (-1.00..-1.00, 6 of 6), CPU 2.00x (2.00..2.00); 97 % CI of the median difference: p50 -1.00..-1.00 ms (better), p99 -1.00..-1.00 ms (better); goal not met\n"},
		{"no CPU figure: latency alone", "warden", rows(6, 1, 1, -1, 0), rows(6, 2, 2, 100, 0),
			"64 KiB, warden - haproxy over 6 runs (median, range, runs no worse): p50 -1.00 ms (-1.00..-1.00, 6 of 6), p99 -1.00 ms (-1.00..-1.00, 6 of 6); 97 % CI of the median difference: p50 -1.00..-1.00 ms (better), p99 -1.00..-1.00 ms (better); goal met\n"},
		{"not warden: no goal", "haproxy-body",
			[]speedRow{row(1, 1, 200)},
			[]speedRow{row(2, 2, 100)},
			"64 KiB, haproxy-body - haproxy over 1 runs (median, range, runs no worse): p50 -1.00 ms (-1.00..-1.00, 1 of 1), p99 -1.00 ms (-1.00..-1.00, 1 of 1), CPU 2.00x (2.00..2.00)\n"},
		// An A/B of two wardens (WARDEN_SPEED_BASE) is no verdict on the goal.
		{"warden against warden-base: no goal", "warden", rows(6, 1, 1, 100, 0), rows(6, 2, 2, 100, 0),
			"64 KiB, warden - warden-base over 6 runs (median, range, runs no worse): p50 -1.00 ms (-1.00..-1.00, 6 of 6), p99 -1.00 ms (-1.00..-1.00, 6 of 6), CPU 1.00x (1.00..1.00); 97 % CI of the median difference: p50 -1.00..-1.00 ms (better), p99 -1.00..-1.00 ms (better)\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ref := "haproxy"
			if strings.HasSuffix(tt.name, "warden-base: no goal") {
				ref = "warden-base"
			}
			if got := pairedVerdict("64 KiB", tt.target, ref, tt.ws, tt.hs); got != tt.want {
				t.Errorf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
}

// TestMedianCI: the interval's order statistics and coverage for a few
// sizes (binomial tails worked by hand), and none under six runs.
func TestMedianCI(t *testing.T) {
	seq := func(n int) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = float64(i + 1)
		}
		return v
	}
	for _, tc := range []struct {
		n            int
		lo, hi, conf float64
	}{
		{1, 0, 0, 0}, {5, 0, 0, 0}, // 1 - 2/32 = 93.75 %: under 95
		{6, 1, 6, 1 - 2.0/64},
		{10, 2, 9, 1 - 2*11.0/1024},
		{15, 4, 12, 1 - 2*576.0/32768},
		{20, 6, 15, 1 - 2*21700.0/1048576},
	} {
		lo, hi, conf := medianCI(seq(tc.n))
		if lo != tc.lo || hi != tc.hi || math.Abs(conf-tc.conf) > 1e-12 {
			t.Errorf("n=%d: %v..%v at %.4f, want %v..%v at %.4f", tc.n, lo, hi, conf, tc.lo, tc.hi, tc.conf)
		}
	}
}

// TestSplitTimes: the parts of a request's latency from the stamps, their
// medians, a part no proxy passed on shown as "-", and no work when
// splitting is off.
func TestSplitTimes(t *testing.T) {
	s := &splitTimes{}
	now := time.Now()
	for i, in := range []time.Duration{300, 100, 200} {
		sent := strconv.FormatInt(now.Add(-in*time.Microsecond).UnixNano(), 10)
		s.received(sent, now)
		if i < 2 {
			s.answered(strconv.FormatInt(now.UnixNano(), 10))
		}
	}
	s.answered("")             // a proxy that dropped the stamp
	s.received("garbage", now) // not counted
	m := s.medians()
	if m[splitIn] < 195 || m[splitIn] > 205 || m[splitBody] < 0 || m[splitBack] < 0 || m[splitLate] != -1 {
		t.Fatalf("medians %v, want sent->backend 200 µs and the other parts measured", m)
	}
	if got := splitRow("64 KiB", "x", [][numSplit]float64{{5, 100, 10, -1}, {7, 300, 30, -1}, {6, 200, 20, -1}}); got !=
		"64 KiB   x                 6              200             20                -\n" {
		t.Errorf("splitRow = %q", got)
	}
	var off *splitTimes
	off.reset()
	off.answered("1")
	s.reset()
	if m := s.medians(); m != [numSplit]float64{-1, -1, -1, -1} {
		t.Errorf("after reset: %v", m)
	}
}
