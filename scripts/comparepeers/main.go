// Command comparepeers measures warden's routings against the routers
// people run instead (issue 47): every strategy of placement.HeadToHead
// (vLLM's own balancer, warden's best routings, the peers' routers) in the
// simulator, on three loads, each over several seeds, and prints, per load,
// sessions and strategy, the prefix-cache hit % (the KPI: vLLM's
// counters, which before vLLM 0.27 count a request waiting in vLLM's queue
// at every lookup) and the hit % at admission (each request once, when
// vLLM admits it), TTFB p50 and p95 and output tokens per minute as
// "median (min-max)" over the seeds, then where
// the best peer beats warden's best routing by more than the seeds' spread
// (its worst seed better than warden's best seed).
//
//	go run ./scripts/comparepeers            # what make compare-peers runs
//	go run ./scripts/comparepeers -quick     # seconds: shorter steps, one seed
//	go run ./scripts/comparepeers -loads d -seeds 1,2,3,4,5 \
//	    -strategies affinity,affinity+kv+admit,dynamo,llm-d-precise
//
// The loads:
//
//	a  the benchmark workload (the bench preset) on the built-in 4 x RTX
//	   A4000 farm at 4, 8, 16, 24 and 32 sessions, 10 minutes a step;
//	b  the 5090-farm preset (agent sessions of ~58k tokens) on
//	   examples/rtx5090-gemma3-27b-int4.yaml (7 x RTX 5090) at 16 and 26
//	   sessions, 40 minutes a step;
//	d  (only when asked, -loads d) the same at 26 sessions from a cold
//	   start: the level alone;
//	c  the conversations of Mooncake's public conversation_trace (its first
//	   1,000 requests, testdata/, Apache 2.0) on the 7 x RTX 5090 farm,
//	   replayed as 26 sessions in a closed loop.
//
// It runs from the repository root. The simulator is deterministic: the
// same seeds print the same bytes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lm-warden/warden/examples"
	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/traces"
)

// load is one workload on one farm, the sessions levels it runs.
type load struct {
	key, title string
	farm       string // a farm file; "" for the built-in example
	workload   string // a preset name; "" with a trace
	trace      string // a Mooncake trace, replayed in a closed loop
	sessions   []int
	duration   time.Duration
}

// loads are the comparison's loads (see the package comment); quick cuts
// them to seconds of work.
func loads(quick bool) []load {
	ls := []load{
		{key: "a", title: "benchmark workload (bench preset), 4 x RTX A4000, Qwen3-4B", workload: "bench",
			sessions: []int{4, 8, 16, 24, 32}, duration: 10 * time.Minute},
		{key: "b", title: "5090-farm preset (agent sessions of ~58k tokens), 7 x RTX 5090, gemma-3-27b-it int4",
			farm: "examples/rtx5090-gemma3-27b-int4.yaml", workload: "5090-farm", sessions: []int{16, 26}, duration: 40 * time.Minute},
		{key: "d", title: "5090-farm preset at 26 sessions from a cold start (the level alone), 7 x RTX 5090, gemma-3-27b-it int4",
			farm: "examples/rtx5090-gemma3-27b-int4.yaml", workload: "5090-farm", sessions: []int{26}, duration: 40 * time.Minute},
		{key: "c", title: "Mooncake conversation_trace (first 1,000 requests) as sessions in a closed loop, 7 x RTX 5090, gemma-3-27b-it int4",
			farm: "examples/rtx5090-gemma3-27b-int4.yaml", trace: filepath.Join("scripts", "comparepeers", "testdata", "mooncake-conversation-head1000.jsonl.gz"),
			sessions: []int{26}},
	}
	if quick {
		ls[0].sessions, ls[0].duration = []int{8, 24}, 2*time.Minute
		ls[1].sessions, ls[1].duration = []int{26}, 4*time.Minute
		ls[2].sessions, ls[2].duration = []int{26}, 4*time.Minute
		ls[3].sessions, ls[3].duration = []int{8}, 2*time.Minute
	}
	return ls
}

// cell is one strategy at one sessions level: each figure per seed.
type cell struct {
	hit, adm, p50, p95, out []float64
}

func main() {
	seeds := flag.String("seeds", "1,2,3", "seeds, comma-separated")
	quick := flag.Bool("quick", false, "shorter steps and one seed, for a test (seconds)")
	only := flag.String("loads", "abc", "which loads to run: a, b, c, d (see the package comment)")
	list := flag.String("strategies", "", "strategies to compare, as warden sim --strategies takes them (default: peers, the head-to-head)")
	flag.Parse()
	ss, err := parseSeeds(*seeds)
	if err == nil && *quick && !isSet("seeds") {
		ss = ss[:1]
	}
	strategies := placement.HeadToHead()
	if err == nil && *list != "" {
		strategies, err = placement.ExpandSpecs(strings.Split(*list, ","))
	}
	if err == nil {
		err = run(context.Background(), os.Stdout, ss, strategies, *quick, *only)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "comparepeers:", err)
		os.Exit(1)
	}
}

func isSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func parseSeeds(s string) ([]uint64, error) {
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("-seeds %q: %q is not a seed (want e.g. 1,2,3)", s, f)
		}
		out = append(out, v)
	}
	return out, nil
}

// run measures the loads named in only over seeds and writes the tables.
func run(ctx context.Context, w io.Writer, seeds []uint64, strategies []string, quick bool, only string) error {
	fmt.Fprintf(w, "Seeds %s; each cell the median (min-max) over the seeds. Strategies: %s.\n",
		joinSeeds(seeds), strings.Join(strategies, ", "))
	for _, l := range loads(quick) {
		if !strings.Contains(only, l.key) {
			continue
		}
		e, err := l.experiment(strategies)
		if err != nil {
			return fmt.Errorf("load %s: %w", l.key, err)
		}
		cells := map[string]*cell{}
		var labels []string
		for _, seed := range seeds {
			e.Seed = seed
			rep, err := sim.Run(ctx, e)
			if err != nil {
				return fmt.Errorf("load %s, seed %d: %w", l.key, seed, err)
			}
			for _, r := range rep.Rows {
				k := key(r.Sessions, r.Strategy)
				c := cells[k]
				if c == nil {
					c = &cell{}
					cells[k] = c
					labels = append(labels, r.Strategy)
				}
				c.hit = append(c.hit, float64(r.PrefixHitPct))
				c.adm = append(c.adm, float64(r.AdmissionHitPct))
				c.p50 = append(c.p50, float64(r.TTFBP50))
				c.p95 = append(c.p95, float64(r.TTFBP95))
				c.out = append(c.out, float64(r.OutputTokensPerMin))
			}
		}
		labels = uniq(labels)
		levels := l.sessions
		fmt.Fprintf(w, "\n### (%s) %s%s\n\n", l.key, l.title, l.steps())
		fmt.Fprintln(w, "| sessions | strategy | prefix hit % | hit % at admission | TTFB p50 s | TTFB p95 s | output tok/min |")
		fmt.Fprintln(w, "|---:|---|---:|---:|---:|---:|---:|")
		for _, n := range levels {
			for _, s := range labels {
				c := cells[key(n, s)]
				if c == nil {
					continue
				}
				fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %s | %s |\n", n, s, band(c.hit, 1), band(c.adm, 1), band(c.p50, 2), band(c.p95, 1), band(c.out, 0))
			}
		}
		fmt.Fprintln(w)
		for _, n := range levels {
			for _, line := range beats(n, labels, cells) {
				fmt.Fprintln(w, "- "+line)
			}
		}
	}
	return nil
}

// experiment builds l's experiment of strategies.
func (l load) experiment(strategies []string) (sim.Experiment, error) {
	e := sim.Experiment{Strategies: strategies, Sessions: l.sessions, Duration: l.duration}
	data, name := examples.Default, examples.DefaultName
	if l.farm != "" {
		var err error
		if data, err = os.ReadFile(l.farm); err != nil {
			return e, err
		}
		name = l.farm
	}
	farm, err := sim.ParseFarm(data, name)
	if err != nil {
		return e, err
	}
	e.Farm = farm
	if l.workload != "" {
		if e.Workload, err = traces.Preset(l.workload); err != nil {
			return e, err
		}
	}
	if l.trace != "" {
		if e.Trace, err = importTrace(l.trace); err != nil {
			return e, err
		}
		e.ClosedLoop = true // Duration 0: to the end of the trace
	}
	return e, nil
}

// steps says how long each step ran.
func (l load) steps() string {
	if l.trace != "" && l.duration == 0 {
		return ", the whole sample"
	}
	return fmt.Sprintf(", %s a step", fmtDur(l.duration))
}

// importTrace imports the Mooncake file at path into a temporary trace
// and loads it.
func importTrace(path string) (*sim.Trace, error) {
	in, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	tmp, err := os.CreateTemp("", "comparepeers-*.jsonl")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	tw := traces.NewWriter(tmp, traces.Header{BlockSize: 16, Source: "mooncake:" + filepath.Base(path), CreatedBy: "comparepeers"})
	_, err = traces.Import("mooncake", in, path, tw, traces.ImportOptions{BlockSize: 16})
	if err = errors.Join(err, tw.Close(), tmp.Close()); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return sim.LoadTrace(tmp.Name())
}

// side says which side of the comparison a strategy label is on:
// "warden" (affinity with any options), "peer" (a peer's router or vLLM's
// own balancer: what one could run instead).
func side(label string) string {
	name, _, _ := strings.Cut(label, " (")
	if name == placement.StrategyAffinity {
		return "warden"
	}
	return "peer"
}

// beats lists, at n sessions, each figure on which the best peer beats
// warden's best routing by more than the seeds' spread.
func beats(n int, labels []string, cells map[string]*cell) []string {
	var out []string
	for _, f := range []struct {
		name   string
		get    func(*cell) []float64
		higher bool
		digits int
	}{
		{"prefix hit %", func(c *cell) []float64 { return c.hit }, true, 1},
		{"hit % at admission", func(c *cell) []float64 { return c.adm }, true, 1},
		{"TTFB p95 s", func(c *cell) []float64 { return c.p95 }, false, 1},
		{"output tok/min", func(c *cell) []float64 { return c.out }, true, 0},
	} {
		better := func(a, b float64) bool { return f.higher && a > b || !f.higher && a < b }
		best := map[string]string{}
		for _, s := range labels {
			c := cells[key(n, s)]
			if c == nil {
				continue
			}
			sd := side(s)
			if b, ok := best[sd]; !ok || better(median(f.get(c)), median(f.get(cells[key(n, b)]))) {
				best[sd] = s
			}
		}
		wl, pl := best["warden"], best["peer"]
		if wl == "" || pl == "" {
			continue
		}
		wv, pv := f.get(cells[key(n, wl)]), f.get(cells[key(n, pl)])
		wBest, pWorst := slices.Max(wv), slices.Min(pv)
		if !f.higher {
			wBest, pWorst = slices.Min(wv), slices.Max(pv)
		}
		if better(pWorst, wBest) {
			out = append(out, fmt.Sprintf("%d sessions, %s: %s %s beats warden's best, %s, %s",
				n, f.name, pl, band(pv, f.digits), wl, band(wv, f.digits)))
		}
	}
	if len(out) == 0 {
		out = append(out, fmt.Sprintf("%d sessions: no peer beats warden's best routing on either hit %%, TTFB p95 or output tok/min by more than the seeds' spread", n))
	}
	return out
}

func key(n int, s string) string { return strconv.Itoa(n) + "\x00" + s }

// band is "median (min-max)", or the value alone for one seed.
func band(v []float64, digits int) string {
	if len(v) == 1 {
		return num(v[0], digits)
	}
	return fmt.Sprintf("%s (%s-%s)", num(median(v), digits), num(slices.Min(v), digits), num(slices.Max(v), digits))
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func num(v float64, digits int) string {
	if math.IsNaN(v) {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', digits, 64)
}

func joinSeeds(seeds []uint64) string {
	s := make([]string, len(seeds))
	for i, v := range seeds {
		s[i] = strconv.FormatUint(v, 10)
	}
	return strings.Join(s, ", ")
}

func fmtDur(d time.Duration) string {
	if d%time.Minute == 0 {
		return fmt.Sprintf("%d min", d/time.Minute)
	}
	return d.String()
}

func uniq(s []string) []string {
	var out []string
	for _, v := range s {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}
