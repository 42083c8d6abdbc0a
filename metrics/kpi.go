package metrics

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"math"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
)

// KPI is one key performance indicator of a report: a PromQL expression with
// the placeholders $model, $window and $window_s (see [Expand]).
type KPI struct {
	Name  string // identifier, [a-z][a-z0-9_]*, e.g. "prefix_hit_pct"
	Title string // human title, e.g. "Prefix-cache hit rate, all replicas"
	Unit  string // e.g. "%", "s", "tokens/min"; may be empty
	Expr  string // PromQL with placeholders, possibly several lines
}

//go:embed kpi.promql
var kpiFile []byte

// kpiFileName names the embedded file in parse errors.
const kpiFileName = "kpi.promql"

var kpis = mustParseKPIs(kpiFileName, kpiFile)

func mustParseKPIs(name string, data []byte) []KPI {
	ks, err := parseKPIs(name, data)
	if err != nil {
		panic(err) // the file is embedded; TestKPIsParse catches this first
	}
	return ks
}

// KPIs returns every KPI of the embedded kpi.promql, in file order. The
// slice is a copy; callers may modify it.
func KPIs() []KPI { return append([]KPI(nil), kpis...) }

// KPIByName returns the KPI called name.
func KPIByName(name string) (KPI, bool) {
	for _, k := range kpis {
		if k.Name == name {
			return k, true
		}
	}
	return KPI{}, false
}

var (
	headerRE      = regexp.MustCompile(`^# ([a-z][a-z0-9_]*): (\S.*?) \[([^\[\]]*)\]$`)
	placeholderRE = regexp.MustCompile(`\$[A-Za-z_][A-Za-z0-9_]*`)
	defineRE      = regexp.MustCompile(`^#define (\$[a-z_][a-z0-9_]*) (\S.*)$`)
	placeholders  = map[string]bool{"$model": true, "$window": true, "$window_s": true, "$range": true}
)

// parseKPIs reads the KPI file format documented at the top of kpi.promql.
// It checks the format and the placeholders, not the PromQL itself (the
// tests parse every expanded expression).
func parseKPIs(file string, data []byte) ([]KPI, error) {
	var (
		out     []KPI
		cur     *KPI
		curLine int
		lines   []string
		seen    = map[string]int{}
		defs    []string // "$name", body pairs for strings.NewReplacer
		defined = map[string]int{}
	)
	flush := func() error {
		if cur == nil {
			return nil
		}
		if len(lines) == 0 {
			return fmt.Errorf("%s:%d: KPI %q has no expression (want PromQL lines after the header)", file, curLine, cur.Name)
		}
		cur.Expr = strings.Join(lines, "\n")
		out = append(out, *cur)
		cur, lines = nil, nil
		return nil
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimRight(sc.Text(), " \t\r")
		switch {
		case line == "":
			if err := flush(); err != nil {
				return nil, err
			}
		case strings.HasPrefix(line, "##"):
			// prose
		case strings.HasPrefix(line, "#define "):
			m := defineRE.FindStringSubmatch(line)
			if m == nil {
				return nil, fmt.Errorf("%s:%d: %q: want \"#define $name PromQL\"", file, n, line)
			}
			if placeholders[m[1]] {
				return nil, fmt.Errorf("%s:%d: #define %s: that is a placeholder", file, n, m[1])
			}
			if prev, dup := defined[m[1]]; dup {
				return nil, fmt.Errorf("%s:%d: %s already defined on line %d", file, n, m[1], prev)
			}
			if err := flush(); err != nil {
				return nil, err
			}
			defined[m[1]] = n
			defs = append(defs, m[1], expandDefs(defs, m[2]))
		case strings.HasPrefix(line, "#"):
			m := headerRE.FindStringSubmatch(line)
			if m == nil {
				return nil, fmt.Errorf("%s:%d: %q: want a header \"# name: Title [unit]\" or prose starting with \"##\"", file, n, line)
			}
			if err := flush(); err != nil {
				return nil, err
			}
			if prev, dup := seen[m[1]]; dup {
				return nil, fmt.Errorf("%s:%d: KPI %q already defined on line %d", file, n, m[1], prev)
			}
			seen[m[1]] = n
			cur, curLine = &KPI{Name: m[1], Title: m[2], Unit: m[3]}, n
		default:
			if cur == nil {
				return nil, fmt.Errorf("%s:%d: expression line outside a KPI block (want a header \"# name: Title [unit]\" first)", file, n)
			}
			if len(defs) > 0 {
				line = expandDefs(defs, line)
			}
			for _, p := range placeholderRE.FindAllString(line, -1) {
				if !placeholders[p] {
					return nil, fmt.Errorf("%s:%d: unknown placeholder %s in KPI %q (want $model, $window, $window_s or $range)", file, n, p, cur.Name)
				}
			}
			lines = append(lines, line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if err := flush(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no KPI defined", file)
	}
	return out, nil
}

// Expand substitutes the placeholders of a KPI expression:
//
//   - $model by model, escaped for a double-quoted PromQL string (the
//     placeholder must stand inside double quotes);
//   - $window by window as a PromQL duration: whole seconds ("180s") when
//     window is a multiple of a second, else whole milliseconds ("90500ms",
//     truncated to the millisecond, PromQL's resolution);
//   - $window_s by window in seconds as a decimal number ("180", "90.5");
//   - $range by window plus one millisecond, in milliseconds ("180001ms"):
//     a range selector that still holds the sample at the window's start
//     on Prometheus 3's left-open ranges (see kpi.promql).
//
// The result is the exact text to send to a Prometheus server. A window under
// one millisecond yields "0ms", which PromQL rejects.
func Expand(expr, model string, window time.Duration) string {
	window = window.Truncate(time.Millisecond)
	var dur string
	if window%time.Second == 0 {
		dur = strconv.FormatInt(int64(window/time.Second), 10) + "s"
	} else {
		dur = strconv.FormatInt(window.Milliseconds(), 10) + "ms"
	}
	secs := strconv.FormatFloat(float64(window.Milliseconds())/1000, 'f', -1, 64)
	esc := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(model)
	rng := strconv.FormatInt(window.Milliseconds()+1, 10) + "ms"
	// Longest placeholder first: $window_s before $window.
	return strings.NewReplacer("$window_s", secs, "$window", dur, "$range", rng, "$model", esc).Replace(expr)
}

// KPIValues evaluates every KPI for model over the window that ends at end
// (so the window is [end-window, end]: pass a step's end and its length).
// A KPI whose result has no labels is stored under its name; one with labels
// (the _by_ KPIs) under name plus the label set, e.g.
// `prefix_hit_pct_by_engine{engine="0"}`. A KPI without data is NaN under its
// name. The first failing KPI (in the table's order) aborts with an error
// naming it. The KPIs are evaluated on up to GOMAXPROCS goroutines: q must
// answer concurrent queries (a [Store] does while nothing appends to it).
func (e *Evaluator) KPIValues(ctx context.Context, q storage.Queryable, model string, end time.Time, window time.Duration) (map[string]float64, error) {
	return e.kpiValues(ctx, q, model, end, window, kpis)
}

// KPIValuesFor is [Evaluator.KPIValues] for the KPIs named only (in the
// table's order), for a caller that needs no others; a name that is not a
// KPI's is an error.
func (e *Evaluator) KPIValuesFor(ctx context.Context, q storage.Queryable, model string, end time.Time, window time.Duration, names ...string) (map[string]float64, error) {
	list := make([]KPI, 0, len(names))
	for _, k := range kpis {
		if slices.Contains(names, k.Name) {
			list = append(list, k)
		}
	}
	if len(list) != len(names) {
		for _, n := range names {
			if !slices.ContainsFunc(kpis, func(k KPI) bool { return k.Name == n }) {
				return nil, fmt.Errorf("metrics: no KPI %q in %s", n, kpiFileName)
			}
		}
		return nil, fmt.Errorf("metrics: KPIs %q named twice", names)
	}
	return e.kpiValues(ctx, q, model, end, window, list)
}

func (e *Evaluator) kpiValues(ctx context.Context, q storage.Queryable, model string, end time.Time, window time.Duration, kpis []KPI) (map[string]float64, error) {
	if window < time.Millisecond {
		return nil, fmt.Errorf("metrics: KPI window %v, want at least 1ms", window)
	}
	vecs := make([]promql.Vector, len(kpis))
	errs := make([]error, len(kpis))
	var next atomic.Int32
	eval := func() {
		for {
			i := int(next.Add(1)) - 1
			if i >= len(kpis) {
				return
			}
			vecs[i], errs[i] = e.Instant(ctx, q, Expand(kpis[i].Expr, model, window), end)
		}
	}
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(kpis)) - 1 {
		wg.Go(eval)
	}
	eval()
	wg.Wait()
	out := make(map[string]float64, len(kpis)+8)
	for i, k := range kpis {
		v, err := vecs[i], errs[i]
		if err != nil {
			return nil, fmt.Errorf("metrics: KPI %s: %w", k.Name, err)
		}
		if len(v) == 0 {
			out[k.Name] = math.NaN()
			continue
		}
		for _, s := range v {
			if s.H != nil {
				return nil, fmt.Errorf("metrics: KPI %s: native histogram result, want floats", k.Name)
			}
			key := k.Name
			if !s.Metric.IsEmpty() {
				key += s.Metric.String()
			}
			out[key] = s.F
		}
	}
	return out, nil
}

// expandDefs replaces every whole-word use of a #define name in line by
// its body ($ttfb is replaced, $ttfb_x is not).
func expandDefs(defs []string, line string) string {
	body := map[string]string{}
	for i := 0; i < len(defs); i += 2 {
		body[defs[i]] = defs[i+1]
	}
	return placeholderRE.ReplaceAllStringFunc(line, func(w string) string {
		if b, ok := body[w]; ok {
			return b
		}
		return w
	})
}
