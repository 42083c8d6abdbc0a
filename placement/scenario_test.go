package placement

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the expected parts of testdata/scenarios/*.txt from actual decisions")

// The scenario format is documented in doc.go. This file holds its parser,
// its runner and the golden test.

// scenarioEpoch is the time of "at 0s".
var scenarioEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Parser limits, so that a fuzzed file cannot ask for gigabytes.
const (
	maxScenarioReplicas = 256
	maxScenarioInt      = 1 << 30
	maxScenarioSessions = 1 << 20
)

type opKind uint8

const (
	opReplicas opKind = iota
	opPolicy
	opState
	opScrape
	opAt
	opPick
	opHome
	opExpectLen
	opExpectReplica
	opObserve
	opEnd
	opAdmit
	opExpire
	opStart
	opFinish
	opServed
)

// assignment is one key=value of a state line, already validated.
type assignment struct {
	field string // inflight, running, waiting, kv, healthy
	n     int
	f     float64
	b     bool
}

type op struct {
	kind opKind
	line int // 1-based

	n, m     int // replicas N max_num_seqs M; replica of state/expect (-1: all)
	strategy string
	cfg      Config
	timeout  time.Duration // policy admission_timeout: the runner's WaitQueue
	assigns  []assignment
	d        time.Duration
	req      Request
	want     string         // expected outcome, canonical; "" when missing (update mode)
	counters map[string]int // expect replica: the fields listed
	prefix   string         // the line before "->", for rewriting
	comment  string         // a trailing "# ..." comment, kept on rewrite
	hits     [4]int         // served: replica, prompt, cached, answer
	held     []int          // pick held=: tokens of the prompt each replica holds (nil: unknown)
}

// scenarioBlock is the block size of a scenario's prompts: held= gives
// tokens, the policy sees blocks of this many.
const scenarioBlock = 16

// scenarioHeld is the scenario runner's placement.HeldIndex: what the
// current pick line says each replica holds.
type scenarioHeld struct{ held *[]int }

func (h scenarioHeld) Held(blocks []uint64, blockTokens int, dst []int) ([]int, bool) {
	if *h.held == nil {
		return dst, false
	}
	for _, tok := range *h.held {
		dst = append(dst, min(tok/blockTokens, len(blocks)))
	}
	return dst, true
}

type scenario struct {
	name  string
	lines []string
	ops   []op
}

// parseScenario parses a scenario file. With allowMissing, expectations
// may be left out (they are filled by -update).
func parseScenario(name, text string, allowMissing bool) (*scenario, error) {
	sc := &scenario{name: name, lines: strings.Split(text, "\n")}
	var haveReplicas, havePolicy bool
	strategy := ""
	var clock time.Duration
	for li, raw := range sc.lines {
		line := li + 1
		errf := func(format string, args ...any) error {
			return fmt.Errorf("%s:%d: %s", name, line, fmt.Sprintf(format, args...))
		}
		fields := strings.Fields(strings.TrimSuffix(raw, "\r"))
		comment := ""
		for k, f := range fields {
			if strings.HasPrefix(f, "#") {
				comment = strings.Join(fields[k:], " ")
				fields = fields[:k]
				break
			}
		}
		if len(fields) == 0 {
			continue
		}
		o := op{line: line, comment: comment}
		// Split off "-> expectation" where the directive has one.
		var lhs, rhs []string
		arrow := false
		for k, f := range fields {
			if f == "->" {
				lhs, rhs, arrow = fields[:k], fields[k+1:], true
				break
			}
		}
		if !arrow {
			lhs = fields
		}
		if len(lhs) == 0 {
			return nil, errf("\"->\" without a directive before it")
		}
		o.prefix = strings.Join(lhs, " ")
		verb, args := lhs[0], lhs[1:]
		if !haveReplicas && verb != "replicas" {
			return nil, errf("%q before \"replicas\": a scenario starts with \"replicas N [max_num_seqs M]\"", verb)
		}
		if arrow && verb != "pick" && verb != "home" && verb != "admit" && verb != "expire" {
			return nil, errf("%q takes no \"->\" expectation", verb)
		}
		switch verb {
		case "replicas":
			if haveReplicas {
				return nil, errf("second \"replicas\" line")
			}
			if len(args) != 1 && len(args) != 3 {
				return nil, errf("want \"replicas N [max_num_seqs M]\"")
			}
			n, err := parseInt(args[0], 0, maxScenarioReplicas)
			if err != nil {
				return nil, errf("replicas: %v", err)
			}
			o.kind, o.n = opReplicas, n
			if len(args) == 3 {
				if args[1] != "max_num_seqs" {
					return nil, errf("unknown %q (want max_num_seqs)", args[1])
				}
				if o.m, err = parseInt(args[2], 0, maxScenarioInt); err != nil {
					return nil, errf("max_num_seqs: %v", err)
				}
			}
			haveReplicas = true
		case "policy":
			if havePolicy {
				return nil, errf("second \"policy\" line")
			}
			if len(args) == 0 {
				return nil, errf("want \"policy hash|least-loaded|affinity [key=value...]\"")
			}
			o.kind, o.strategy = opPolicy, args[0]
			if _, err := New(o.strategy, Config{}); err != nil {
				return nil, errf("%v", err)
			}
			for _, kv := range args[1:] {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return nil, errf("%q: want key=value", kv)
				}
				if o.strategy != StrategyAffinity {
					return nil, errf("%q: only policy affinity takes options", kv)
				}
				var err error
				switch k {
				case "spill":
					o.cfg.Spill, err = ParseSpillThreshold(v)
				case "ttl":
					o.cfg.SessionTTL, err = parseDuration(v)
					if err == nil && o.cfg.SessionTTL <= 0 {
						err = errors.New("want a positive duration")
					}
				case "active_window":
					o.cfg.ActiveWindow, err = parseDuration(v)
					if err == nil && o.cfg.ActiveWindow <= 0 {
						err = errors.New("want a positive duration")
					}
				case "max_sessions":
					o.cfg.MaxSessions, err = parseInt(v, 1, maxScenarioSessions)
				case "disabled":
					o.cfg.Disabled, err = strconv.ParseBool(v)
				case "balance":
					o.cfg.Balance, err = ParseBalance(v)
				case "admission":
					o.cfg.Admission, err = ParseAdmission(v)
				case "admission_timeout":
					o.timeout, err = parseDuration(v)
				case "rehome":
					o.cfg.Rehome, err = ParseRehome(v)
				case "prefix":
					o.cfg.Prefix, err = ParsePrefixUse(v)
				default:
					return nil, errf("unknown option %q (want spill, ttl, active_window, max_sessions, disabled, balance, admission, admission_timeout, rehome, prefix)", k)
				}
				if err != nil {
					return nil, errf("%s: %v", k, err)
				}
			}
			strategy, havePolicy = o.strategy, true
		case "state":
			if len(args) < 2 {
				return nil, errf("want \"state ID|all key=value...\"")
			}
			o.kind, o.n = opState, -1
			if args[0] != "all" {
				var err error
				if o.n, err = parseInt(args[0], 0, sc.ops[0].n-1); err != nil {
					return nil, errf("replica: %v", err)
				}
			}
			for _, kv := range args[1:] {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return nil, errf("%q: want key=value", kv)
				}
				a := assignment{field: k}
				var err error
				switch k {
				case "inflight", "running", "waiting":
					a.n, err = parseInt(v, 0, maxScenarioInt)
				case "kv":
					a.f, err = strconv.ParseFloat(v, 64)
					if err == nil && !(a.f >= 0 && a.f <= 1) {
						err = errors.New("want a fraction 0..1")
					}
				case "kv_capacity", "prefill_rate", "prefill_queue":
					a.n, err = parseInt(v, 0, maxScenarioInt)
				case "healthy":
					a.b, err = strconv.ParseBool(v)
				default:
					return nil, errf("unknown field %q (want inflight, running, waiting, kv, kv_capacity, prefill_rate, prefill_queue, healthy)", k)
				}
				if err != nil {
					return nil, errf("%s: %v", k, err)
				}
				o.assigns = append(o.assigns, a)
			}
		case "scrape":
			if len(args) != 0 {
				return nil, errf("\"scrape\" takes no arguments")
			}
			o.kind = opScrape
		case "at":
			if len(args) != 1 {
				return nil, errf("want \"at DURATION\"")
			}
			d, err := parseDuration(args[0])
			if err != nil {
				return nil, errf("at: %v", err)
			}
			if d < clock {
				return nil, errf("at %v is before the current %v: time never runs backwards", d, clock)
			}
			o.kind, o.d, clock = opAt, d, d
		case "pick":
			if !havePolicy {
				return nil, errf("\"pick\" before \"policy\"")
			}
			o.kind = opPick
			o.req.Pinned = NoPin
			for _, kv := range args {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return nil, errf("%q: want key=value", kv)
				}
				switch k {
				case "session":
					o.req.Session = v
				case "parent":
					o.req.Parent = v
				case "prompt", "shared":
					n, err := parseInt(v, 0, maxScenarioInt)
					if err != nil {
						return nil, errf("%s: %v", k, err)
					}
					if k == "prompt" {
						o.req.PromptTokens = n
					} else {
						o.req.SharedPrefixTokens = n
					}
				case "pinned":
					if v == "" {
						continue
					}
					var err error
					if o.req.Pinned, err = parseInt(v, NoPin, maxScenarioInt); err != nil {
						return nil, errf("pinned: %v", err)
					}
				case "held":
					o.held = []int{}
					for _, f := range strings.Split(v, ",") {
						n, err := parseInt(f, 0, maxScenarioInt)
						if err != nil {
							return nil, errf("held: %v", err)
						}
						o.held = append(o.held, n)
					}
					if len(o.held) != sc.ops[0].n {
						return nil, errf("held: %d values for %d replicas", len(o.held), sc.ops[0].n)
					}
				default:
					return nil, errf("unknown field %q (want session, parent, pinned, prompt, shared, held)", k)
				}
			}
			switch {
			case !arrow && allowMissing:
			case !arrow:
				return nil, errf("pick without \"-> ID REASON\" or \"-> none\" (run with -update to fill it in)")
			case len(rhs) == 1 && (rhs[0] == "none" || rhs[0] == "wait"):
				o.want = rhs[0]
			case len(rhs) == 2:
				id, err := parseInt(rhs[0], 0, maxScenarioReplicas)
				if err != nil {
					return nil, errf("expected replica: %v", err)
				}
				reason, err := ParseReason(rhs[1])
				if err != nil {
					return nil, errf("%v", err)
				}
				o.want = formatPick(Decision{Replica: id, Reason: reason}, nil)
			default:
				return nil, errf("want \"-> ID REASON\" or \"-> none\" after pick")
			}
		case "start", "finish":
			if strategy != StrategyAffinity {
				return nil, errf("%q needs policy affinity (the only one with a session table)", verb)
			}
			o.kind = opStart
			if verb == "finish" {
				o.kind = opFinish
			}
			if len(args) < 1 || len(args) > 2 || !strings.HasPrefix(args[0], "session=") || (verb == "start" && len(args) != 1) {
				return nil, errf("want \"start session=S\" or \"finish session=S [tokens=N]\"")
			}
			o.req.Session = strings.TrimPrefix(args[0], "session=")
			if len(args) == 2 {
				if !strings.HasPrefix(args[1], "tokens=") {
					return nil, errf("want \"finish session=S [tokens=N]\"")
				}
				n, err := parseInt(strings.TrimPrefix(args[1], "tokens="), 0, maxScenarioInt)
				if err != nil {
					return nil, errf("tokens: %v", err)
				}
				o.n = n
			}
		case "observe", "end":
			if strategy != StrategyAffinity {
				return nil, errf("%q needs policy affinity (the only one with a session table)", verb)
			}
			o.kind = opEnd
			want := 1
			if verb == "observe" {
				o.kind, want = opObserve, 2
			}
			if len(args) != want || !strings.HasPrefix(args[0], "session=") {
				return nil, errf("want \"observe session=S tokens=N\" or \"end session=S\"")
			}
			o.req.Session = strings.TrimPrefix(args[0], "session=")
			if verb == "observe" {
				if !strings.HasPrefix(args[1], "tokens=") {
					return nil, errf("want \"observe session=S tokens=N\"")
				}
				n, err := parseInt(strings.TrimPrefix(args[1], "tokens="), 0, maxScenarioInt)
				if err != nil {
					return nil, errf("tokens: %v", err)
				}
				o.n = n
			}
		case "served":
			if strategy != StrategyAffinity {
				return nil, errf("%q needs policy affinity (the only one with a session table)", verb)
			}
			const usage = "want \"served session=S replica=ID prompt=N cached=N [answer=N]\" (cached=-1: not reported)"
			if len(args) < 4 || len(args) > 5 || !strings.HasPrefix(args[0], "session=") {
				return nil, errf(usage)
			}
			o.kind, o.req.Session = opServed, strings.TrimPrefix(args[0], "session=")
			o.hits = [4]int{0, 0, 0, -1}
			for k, name := range []string{"replica", "prompt", "cached", "answer"} {
				if k+1 >= len(args) {
					break
				}
				v, ok := strings.CutPrefix(args[k+1], name+"=")
				if !ok {
					return nil, errf(usage)
				}
				lo, hi := 0, maxScenarioInt
				if name == "replica" {
					hi = maxScenarioReplicas
				}
				if name == "cached" {
					lo = -1
				}
				n, err := parseInt(v, lo, hi)
				if err != nil {
					return nil, errf("%s: %v", name, err)
				}
				o.hits[k] = n
			}
		case "admit", "expire":
			if strategy != StrategyAffinity {
				return nil, errf("%q needs policy affinity (the only one with a session table)", verb)
			}
			if len(args) != 0 {
				return nil, errf("%q takes no arguments", verb)
			}
			o.kind = opAdmit
			if verb == "expire" {
				o.kind = opExpire
			}
			switch {
			case !arrow && allowMissing:
			case !arrow:
				return nil, errf("%s without \"-> ...\" (run with -update to fill it in)", verb)
			case verb == "admit" && len(rhs) == 1 && (rhs[0] == "wait" || rhs[0] == "empty"):
				o.want = rhs[0]
			case verb == "admit" && len(rhs) == 3 && strings.HasPrefix(rhs[0], "session="):
				id, err := parseInt(rhs[1], 0, maxScenarioReplicas)
				if err != nil {
					return nil, errf("expected replica: %v", err)
				}
				reason, err := ParseReason(rhs[2])
				if err != nil {
					return nil, errf("%v", err)
				}
				o.want = rhs[0] + " " + formatPick(Decision{Replica: id, Reason: reason}, nil)
			case verb == "expire" && len(rhs) == 1:
				o.want = rhs[0]
			default:
				return nil, errf("want \"admit -> session=S ID REASON | wait | empty\" or \"expire -> S[,S...] | none\"")
			}
		case "home":
			if strategy != StrategyAffinity {
				return nil, errf("\"home\" needs policy affinity (the only one with a session table)")
			}
			if len(args) != 1 || !strings.HasPrefix(args[0], "session=") {
				return nil, errf("want \"home session=S -> ID|none\"")
			}
			o.kind, o.req.Session = opHome, strings.TrimPrefix(args[0], "session=")
			switch {
			case !arrow && allowMissing:
			case len(rhs) == 1 && rhs[0] == "none":
				o.want = "none"
			case len(rhs) == 1:
				id, err := parseInt(rhs[0], 0, maxScenarioReplicas)
				if err != nil {
					return nil, errf("expected home: %v", err)
				}
				o.want = strconv.Itoa(id)
			default:
				return nil, errf("want \"-> ID\" or \"-> none\" after home")
			}
		case "expect":
			if strategy != StrategyAffinity {
				return nil, errf("\"expect\" needs policy affinity (the only one with a session table)")
			}
			switch {
			case len(args) == 1 && strings.HasPrefix(args[0], "sessions="):
				n, err := parseInt(strings.TrimPrefix(args[0], "sessions="), 0, maxScenarioInt)
				if err != nil {
					return nil, errf("sessions: %v", err)
				}
				o.kind, o.want = opExpectLen, strconv.Itoa(n)
			case len(args) >= 2 && args[0] == "replica":
				id, err := parseInt(args[1], 0, sc.ops[0].n-1)
				if err != nil {
					return nil, errf("replica: %v", err)
				}
				o.kind, o.n, o.counters = opExpectReplica, id, map[string]int{}
				for _, kv := range args[2:] {
					k, v, ok := strings.Cut(kv, "=")
					if !ok || counterField(ReplicaCounters{}, k) < 0 {
						return nil, errf("%q: want one of %s=N", kv, strings.Join(counterNames, "=N, "))
					}
					if o.counters[k], err = parseInt(v, 0, maxScenarioInt); err != nil {
						return nil, errf("%s: %v", k, err)
					}
				}
				if len(o.counters) == 0 && !allowMissing {
					return nil, errf("expect replica %d lists no counters (run with -update to fill them in)", id)
				}
			default:
				return nil, errf("want \"expect sessions=N\" or \"expect replica ID counter=N...\"")
			}
		default:
			return nil, errf("unknown directive %q (want replicas, policy, state, scrape, at, pick, home, observe, served, start, finish, end, admit, expire, expect)", verb)
		}
		sc.ops = append(sc.ops, o)
	}
	if !haveReplicas {
		return nil, fmt.Errorf("%s: no \"replicas\" line", name)
	}
	return sc, nil
}

func parseInt(s string, lo, hi int) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not an integer", s)
	}
	if n < lo || n > hi {
		return 0, fmt.Errorf("%d is out of range %d..%d", n, lo, hi)
	}
	return n, nil
}

func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration such as 90s or 5m", s)
	}
	if d < 0 || d > 100*365*24*time.Hour {
		return 0, fmt.Errorf("%v is out of range 0..100 years", d)
	}
	return d, nil
}

var counterNames = []string{"sessions", "active", "new", "parent", "sticky", "spilled_in", "pinned", "footprint", "held", "held_footprint", "rehomed"}

// counterField returns the named counter of c, or -1 for an unknown name.
func counterField(c ReplicaCounters, name string) int {
	switch name {
	case "sessions":
		return c.Sessions
	case "active":
		return c.Active
	case "new":
		return c.New
	case "parent":
		return c.Parent
	case "sticky":
		return c.Sticky
	case "rehomed":
		return c.Rehomed
	case "spilled_in":
		return c.SpilledIn
	case "pinned":
		return c.ClientPinned
	case "footprint":
		return c.Footprint
	case "held":
		return c.Held
	case "held_footprint":
		return c.HeldFootprint
	}
	return -1
}

func formatPick(d Decision, err error) string {
	switch {
	case errors.Is(err, ErrNoHealthyReplica):
		return "none"
	case err != nil:
		return "error: " + err.Error()
	case d.Wait:
		return "wait"
	}
	return fmt.Sprintf("%d %s", d.Replica, d.Reason)
}

// outcome is one checked line: what the file says and what happened.
type outcome struct {
	line    int
	want    string // canonical expectation ("" when missing)
	got     string // canonical actual outcome
	rewrite string // the line as -update writes it
}

func (o outcome) ok() bool { return o.want == o.got }

// run executes the scenario and returns one outcome per checked line.
func (sc *scenario) run() ([]outcome, error) {
	var (
		snap    Snapshot
		router  *Router // drives the policy as the simulator and the proxy do
		now     = scenarioEpoch
		out     []outcome
		queue   WaitQueue[Request] // requests that got Wait, as a caller keeps them
		timeout time.Duration
		held    []int // the current pick's held= (nil: unknown)
	)
	// table is the policy's session table; one that keeps none (affinity
	// switched off) shows an empty one.
	table := func() *Table {
		if t := router.Table(); t != nil {
			return t
		}
		return NewTableWindow(0, 0, 0)
	}
	withComment := func(s, comment string) string {
		if comment != "" {
			return s + "  " + comment
		}
		return s
	}
	for _, o := range sc.ops {
		switch o.kind {
		case opReplicas:
			snap.MaxNumSeqs = o.m
			snap.Replicas = make([]Replica, o.n)
			for i := range snap.Replicas {
				snap.Replicas[i] = Replica{ID: i, Healthy: true}
			}
		case opPolicy:
			p, err := New(o.strategy, o.cfg)
			if err != nil {
				return nil, fmt.Errorf("%s:%d: %v", sc.name, o.line, err)
			}
			router = NewRouter(p, nil)
			router.TurnEnds = true // start and finish lines report turn ends
			router.SetHeld(scenarioHeld{&held})
			timeout = o.timeout
		case opState:
			for i := range snap.Replicas {
				if o.n >= 0 && i != o.n {
					continue
				}
				r := &snap.Replicas[i]
				for _, a := range o.assigns {
					switch a.field {
					case "inflight":
						r.InFlight = a.n
					case "running":
						r.Running = a.n
					case "waiting":
						r.Waiting = a.n
					case "kv":
						r.KVUsage = a.f
					case "healthy":
						r.Healthy = a.b
					case "kv_capacity":
						r.KVCapacityTokens = a.n
					case "prefill_rate":
						r.PrefillTokensPerSec = float64(a.n)
					case "prefill_queue":
						r.PrefillQueueTokens = a.n
					}
				}
			}
		case opScrape:
			snap.Generation++
		case opAt:
			now = scenarioEpoch.Add(o.d)
		case opPick:
			req := o.req
			held = o.held
			if n := (req.PromptTokens + scenarioBlock - 1) / scenarioBlock; n > 0 {
				req.Prompt.BlockTokens = scenarioBlock
				req.Prompt.Blocks = make([]uint64, n) // the ids do not matter: held= says what is held
			}
			var (
				d   Decision
				err error
			)
			if router.MustQueue(&req, queue.Len(), now) {
				d = Decision{Replica: -1, Reason: ReasonNew, Wait: true} // behind the others, without asking
			} else {
				d, err = router.Pick(&req, &snap, now)
			}
			if err == nil && d.Wait {
				queue.Push(req, now)
			}
			got := formatPick(d, err)
			out = append(out, outcome{o.line, o.want, got, withComment(o.prefix+" -> "+got, o.comment)})
		case opObserve:
			table().Observe(o.req.Session, o.n)
		case opEnd:
			router.Forget(o.req.Session)
		case opServed:
			router.Served(o.req.Session, o.hits[0], o.hits[1], o.hits[2], o.hits[3])
		case opStart:
			router.Sent(o.req.Session, now)
		case opFinish:
			router.Ended(o.req.Session, o.n, now)
		case opAdmit:
			got := "empty"
			if req, _, ok := queue.Front(); ok {
				d, err := router.Pick(&req, &snap, now)
				got = formatPick(d, err)
				if err == nil && !d.Wait {
					queue.Pop()
					got = "session=" + req.Session + " " + got
				}
			}
			out = append(out, outcome{o.line, o.want, got, withComment(o.prefix+" -> "+got, o.comment)})
		case opExpire:
			var names []string
			for _, req := range queue.Expired(now, timeout, nil) {
				names = append(names, req.Session)
			}
			got := "none"
			if len(names) > 0 {
				got = strings.Join(names, ",")
			}
			out = append(out, outcome{o.line, o.want, got, withComment(o.prefix+" -> "+got, o.comment)})
		case opHome:
			got := "none"
			if h, ok := table().Home(o.req.Session, now); ok {
				got = strconv.Itoa(h)
			}
			out = append(out, outcome{o.line, o.want, got, withComment(o.prefix+" -> "+got, o.comment)})
		case opExpectLen:
			got := strconv.Itoa(table().Len())
			out = append(out, outcome{o.line, o.want, got, withComment("expect sessions="+got, o.comment)})
		case opExpectReplica:
			var c ReplicaCounters
			if cs := table().Counters(); o.n < len(cs) {
				c = cs[o.n]
			}
			// Check (and rewrite) the counters the line lists; a line that
			// lists none is rewritten with all of them.
			var want, got, all []string
			for _, name := range counterNames {
				kv := fmt.Sprintf("%s=%d", name, counterField(c, name))
				all = append(all, kv)
				if w, ok := o.counters[name]; ok {
					want = append(want, fmt.Sprintf("%s=%d", name, w))
					got = append(got, kv)
				}
			}
			if len(got) == 0 {
				got = all
			}
			rewrite := withComment(fmt.Sprintf("expect replica %d %s", o.n, strings.Join(got, " ")), o.comment)
			if len(want) == 0 {
				got = nil
			}
			out = append(out, outcome{o.line, strings.Join(want, " "), strings.Join(got, " "), rewrite})
		}
	}
	return out, nil
}

// updated returns the scenario text with every checked line rewritten
// from its actual outcome.
func (sc *scenario) updated(outs []outcome) string {
	lines := append([]string(nil), sc.lines...)
	for _, o := range outs {
		lines[o.line-1] = o.rewrite
	}
	return strings.Join(lines, "\n")
}

func TestScenarios(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "scenarios", "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 12 {
		t.Fatalf("found %d scenario files under testdata/scenarios, want at least 12", len(files))
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txt"), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			sc, err := parseScenario(file, string(data), *update)
			if err != nil {
				t.Fatal(err)
			}
			outs, err := sc.run()
			if err != nil {
				t.Fatal(err)
			}
			if *update {
				if text := sc.updated(outs); text != string(data) {
					if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
						t.Fatal(err)
					}
					t.Logf("rewrote %s", file)
				}
				return
			}
			if len(outs) == 0 {
				t.Fatalf("%s checks nothing", file)
			}
			for _, o := range outs {
				if !o.ok() {
					t.Errorf("%s:%d: got %q, want %q", file, o.line, o.got, o.want)
				}
			}
		})
	}
}

func TestParseScenarioErrors(t *testing.T) {
	tests := []struct {
		name, text, want string
	}{
		{"no replicas", "policy hash\n", "x.txt:1: \"policy\" before \"replicas\""},
		{"empty", "# nothing\n", "x.txt: no \"replicas\" line"},
		{"bad count", "replicas four\n", "x.txt:1: replicas: \"four\" is not an integer"},
		{"too many", "replicas 100000\n", "x.txt:1: replicas: 100000 is out of range"},
		{"unknown verb", "replicas 2\n\nfrobnicate\n", "x.txt:3: unknown directive \"frobnicate\""},
		{"unknown strategy", "replicas 2\npolicy random\n", "x.txt:2: placement: unknown strategy \"random\" (want one of hash, least-loaded, affinity, llm-d"},
		{"bad spill", "replicas 2\npolicy affinity spill=lots\n", "x.txt:2: spill: want auto, priced or a positive integer, got \"lots\""},
		{"option on hash", "replicas 2\npolicy hash spill=3\n", "x.txt:2: \"spill=3\": only policy affinity takes options"},
		{"state out of range", "replicas 2\nstate 2 inflight=1\n", "x.txt:2: replica: 2 is out of range 0..1"},
		{"bad kv", "replicas 2\nstate 0 kv=1.5\n", "x.txt:2: kv: want a fraction 0..1"},
		{"time backwards", "replicas 2\nat 10s\nat 5s\n", "x.txt:3: at 5s is before the current 10s"},
		{"pick before policy", "replicas 2\npick session=a -> 0 new\n", "x.txt:2: \"pick\" before \"policy\""},
		{"missing expectation", "replicas 2\npolicy hash\npick session=a\n", "x.txt:3: pick without"},
		{"bad reason", "replicas 2\npolicy hash\npick session=a -> 0 lucky\n", "x.txt:3: unknown reason \"lucky\""},
		{"home on hash", "replicas 2\npolicy hash\nhome session=a -> none\n", "x.txt:3: \"home\" needs policy affinity"},
		{"bad window", "replicas 2\npolicy affinity active_window=0s\n", "x.txt:2: active_window: want a positive duration"},
		{"window on hash", "replicas 2\npolicy hash active_window=2m\n", "x.txt:2: \"active_window=2m\": only policy affinity takes options"},
		{"bad counter", "replicas 2\npolicy affinity\nexpect replica 0 wins=3\n", "x.txt:3: \"wins=3\": want one of sessions=N"},
		{"arrow on state", "replicas 2\nstate 0 inflight=1 -> 3\n", "x.txt:2: \"state\" takes no \"->\" expectation"},
		{"start on hash", "replicas 2\npolicy hash\nstart session=a\n", "x.txt:3: \"start\" needs policy affinity"},
		{"start with tokens", "replicas 2\npolicy affinity\nstart session=a tokens=3\n", "x.txt:3: want \"start session=S\" or \"finish session=S [tokens=N]\""},
		{"finish bad tokens", "replicas 2\npolicy affinity\nfinish session=a tokens=x\n", "x.txt:3: tokens: \"x\" is not an integer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseScenario("x.txt", tt.text, false)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("parseScenario error = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

// FuzzScenario checks that the parser never panics, that whatever parses
// also runs, and that a file rewritten from its actual outcomes parses
// strictly and replays with every expectation met (decisions are
// deterministic).
func FuzzScenario(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "scenarios", "*.txt"))
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(data))
	}
	f.Add("replicas 3 max_num_seqs 8\npolicy affinity spill=1 max_sessions=2\npick session=a\nstate 0 inflight=2\npick session=a\nexpect replica 0\n")
	f.Add("replicas 2\npolicy affinity ttl=10m active_window=1m\npick session=a\nat 30s\npick session=b\nat 1m20s\nexpect replica 0 active=0\npick session=c\nhome session=a\n")
	f.Add("replicas 2\npolicy least-loaded\nstate all waiting=1\nscrape\npick\npick pinned=1\n")
	f.Fuzz(func(t *testing.T, text string) {
		sc, err := parseScenario("fuzz.txt", text, true)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.txt:") {
				t.Fatalf("error without the file name: %v", err)
			}
			return
		}
		outs, err := sc.run()
		if err != nil {
			t.Fatalf("parsed but did not run: %v", err)
		}
		for _, o := range outs {
			if strings.HasPrefix(o.got, "error: ") {
				t.Fatalf("line %d: unexpected policy error %s", o.line, o.got)
			}
		}
		text2 := sc.updated(outs)
		sc2, err := parseScenario("fuzz.txt", text2, false)
		if err != nil {
			t.Fatalf("rewritten scenario does not parse: %v\n%s", err, text2)
		}
		outs2, err := sc2.run()
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range outs2 {
			if !o.ok() {
				t.Fatalf("replay line %d: got %q, want %q\n%s", o.line, o.got, o.want, text2)
			}
		}
	})
}
