package placement

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// The registry: every strategy warden knows, by name, with what the rest
// of warden needs to know of it. The proxy's config check, `warden sim`,
// `warden plan`, `warden tune`, the plan's glossary and calibrate read it;
// none restates a name. A strategy is one file defining its policy and its
// Strategy value, plus one line in registry below (doc.go: "Adding a
// strategy").

// Strategy describes one routing strategy.
type Strategy struct {
	// Name is what --strategies, a farm's routing.strategy and the proxy's
	// models[].strategy call it.
	Name string
	// Words say in plain words what it does with a turn, for a reader who
	// has not read the code (the plan's glossary: "each conversation goes
	// to the replica its session id hashes to, whatever the load").
	Words string
	// Reasons are the decision reasons it gives (Decision.Reason, the
	// reason label of warden_requests_total): calibrate infers which
	// strategy served a farm from the reasons only one strategy gives.
	Reasons []Reason
	// Options are the words it takes after "+" in a strategy spec
	// ("affinity+kv+priced+admit=30s"), in display order.
	Options []Option
	// Spills says it has a spill threshold (Config.Spill): warden plan
	// tries it once per spill threshold.
	Spills bool
	// Proxy says the proxy serves it (warden proxy, warden epp); the others
	// run in warden sim, plan and tune only.
	Proxy bool
	// Peer says it models a router people run instead of warden
	// (notes/peer-routers.md; peers.go): PeerNames lists them.
	Peer bool
	// HeadToHead are the specs of it that the head-to-head runs (the
	// group "peers" of a strategy list): warden's best routings, vLLM's
	// own balancer. A peer's is its name, unless given.
	HeadToHead []string
	// New makes its policy from a configuration (defaults filled in by the
	// caller, the spec's options applied).
	New func(Config) (Policy, error)
}

// Option is one word of a strategy spec after "+": a flag ("kv"), or a
// flag with a value ("admit=30s", a duration above zero).
type Option struct {
	Name string
	// Arg names the value of name=VALUE ("TIMEOUT"); "" when the option
	// takes none. A valued option may be given bare, which leaves its
	// value to the farm or the proxy's default.
	Arg string
	// ArgWords say what the value must be, for the error that refuses
	// one: "an admission timeout > 0 such as admit=30s (...)".
	ArgWords string
	// Words say what it changes, in plain words, as a clause of the
	// strategy's Words ("" when another part of the glossary says it).
	Words string
	// set turns the option on in a spec, with its value (0 when bare).
	set func(s *Spec, d time.Duration)
}

// registry lists every strategy, in the order warden shows them.
var registry = []*Strategy{
	&hashStrategy,
	&leastLoadedStrategy,
	&affinityStrategy,
	&llmdStrategy,
	&llmdPreciseStrategy,
	&dynamoStrategy,
	&sglangStrategy,
	&vllmRouterStrategy,
	&vllmRouterHashStrategy,
	&productionStackStrategy,
	&rayPrefixStrategy,
	&aibrixStrategy,
	&liteLLMStrategy,
	&nginxHashStrategy,
}

// Strategy names of the product's own strategies.
const (
	StrategyHash        = "hash"
	StrategyLeastLoaded = "least-loaded"
	StrategyAffinity    = "affinity"
)

// Strategies returns the names of every registered strategy, in the
// registry's order.
func Strategies() []string { return names(func(*Strategy) bool { return true }) }

// ProxyStrategies returns the names of the strategies the proxy serves.
func ProxyStrategies() []string { return names(func(s *Strategy) bool { return s.Proxy }) }

// names lists, in the registry's order, the strategies keep keeps.
func names(keep func(*Strategy) bool) []string {
	var out []string
	for _, s := range registry {
		if keep(s) {
			out = append(out, s.Name)
		}
	}
	return out
}

// Registered returns every strategy, in the registry's order. The values
// are copies: changing them changes nothing.
func Registered() []Strategy {
	out := make([]Strategy, len(registry))
	for i, s := range registry {
		out[i] = *s
	}
	return out
}

// LookupStrategy returns the strategy named name.
func LookupStrategy(name string) (Strategy, bool) {
	for _, s := range registry {
		if s.Name == name {
			return *s, true
		}
	}
	return Strategy{}, false
}

// New returns the policy of strategy (a registered name) configured by
// cfg.
func New(strategy string, cfg Config) (Policy, error) {
	s, ok := LookupStrategy(strategy)
	if !ok {
		return nil, fmt.Errorf("placement: unknown strategy %q (want one of %s)", strategy, strings.Join(Strategies(), ", "))
	}
	return s.New(cfg)
}

// Spec is a strategy name with its options, as warden sim --strategies,
// warden plan's strategies and warden tune's --variants read them:
// NAME[+OPTION[=VALUE]]..., e.g. "affinity+kv+priced+admit=30s". It
// records the options the name gives, not those of a farm's routing block
// (Apply puts them into a Config).
type Spec struct {
	Strategy string
	KV       bool // +kv: balance kv (new conversations by KV headroom)
	Priced   bool // +priced: spill_threshold priced
	Admit    bool // +admit or +admit=D: admission kv
	// AdmissionTimeout is D of admit=D; 0: the farm's (or the proxy's
	// default).
	AdmissionTimeout time.Duration
	Rehome           bool // +rehome: rehome cold
	Prefix           bool // +prefix: prefix held
}

// ParseSpec parses a strategy spec, naming what is wrong.
func ParseSpec(s string) (Spec, error) {
	name, opts, hasOpts := strings.Cut(s, "+")
	st, ok := LookupStrategy(name)
	if !ok {
		return Spec{}, fmt.Errorf("unknown strategy %q (want one of %s%s%s)", s, strings.Join(Strategies(), ", "), optionsHelp(", or "), groupsHelp())
	}
	sp := Spec{Strategy: name}
	if !hasOpts {
		return sp, nil
	}
	if len(st.Options) == 0 {
		return Spec{}, fmt.Errorf("strategy %q: %s", s, takesOptions())
	}
	for w := range strings.SplitSeq(opts, "+") {
		key, val, hasVal := strings.Cut(w, "=")
		i := slices.IndexFunc(st.Options, func(o Option) bool { return o.Name == key })
		if i < 0 || (hasVal && st.Options[i].Arg == "") {
			return Spec{}, fmt.Errorf("strategy %q: unknown option %q (want %s)", s, w, optionList(&st))
		}
		o := st.Options[i]
		var d time.Duration
		if hasVal {
			var err error
			if d, err = time.ParseDuration(val); err != nil || d <= 0 {
				return Spec{}, fmt.Errorf("strategy %q: %s: want %s", s, w, o.ArgWords)
			}
		}
		o.set(&sp, d)
	}
	return sp, nil
}

// takesOptions says which strategies take options, for an error message:
// "only affinity takes options (kv, priced, admit, admit=TIMEOUT, rehome)".
func takesOptions() string {
	var with []string
	for _, s := range registry {
		if len(s.Options) > 0 {
			with = append(with, s.Name+" ("+optionList(s)+")")
		}
	}
	switch len(with) {
	case 0:
		return "no strategy takes options"
	case 1:
		return "only " + strings.Replace(with[0], " (", " takes options (", 1)
	}
	return "only these take options: " + strings.Join(with, "; ")
}

// optionsHelp is prefix + "NAME+OPTION... with options ..." for every
// strategy that takes options, "" when none does.
func optionsHelp(prefix string) string {
	var parts []string
	for _, s := range registry {
		if len(s.Options) > 0 {
			parts = append(parts, s.Name+"+OPTION... with options "+optionList(s))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return prefix + strings.Join(parts, "; ")
}

// OptionsHelp is the grammar of strategy specs in a line, for --help:
// "hash, least-loaded, affinity, ..., or affinity+OPTION... with options
// kv, priced, admit, admit=TIMEOUT, rehome, prefix; or peers (every peer's
// router: llm-d, ...)".
func OptionsHelp() string {
	return strings.Join(Strategies(), ", ") + optionsHelp(", or ") + groupsHelp()
}

// groupsHelp is "; or peers (every peer's router: ...)" for the group
// names a strategy list takes.
func groupsHelp() string {
	var parts []string
	for _, g := range groups() {
		parts = append(parts, g.Name+" ("+g.Words+")")
	}
	if len(parts) == 0 {
		return ""
	}
	return "; or " + strings.Join(parts, ", ")
}

// optionList is "kv, priced, admit, admit=TIMEOUT, rehome".
func optionList(s *Strategy) string {
	var ws []string
	for _, o := range s.Options {
		ws = append(ws, o.Name)
		if o.Arg != "" {
			ws = append(ws, o.Name+"="+o.Arg)
		}
	}
	return strings.Join(ws, ", ")
}

// Group is a name that stands for several strategies in a strategy list
// (warden sim --strategies, warden tune --variants): "peers" for the
// head-to-head, every peer's router beside warden's best routings and
// vLLM's own balancer (HeadToHead), so that one word runs the whole
// comparison.
type Group struct {
	Name  string
	Words string   // what it stands for, for --help and errors
	specs []string // its members, resolved when the group is expanded
}

// GroupPeers is the group of the head-to-head (HeadToHead).
const GroupPeers = "peers"

// HeadToHead lists the specs of the head-to-head, in the registry's order:
// each strategy's Strategy.HeadToHead, a peer's name when it gives none.
func HeadToHead() []string {
	var out []string
	for _, s := range registry {
		switch {
		case len(s.HeadToHead) > 0:
			out = append(out, s.HeadToHead...)
		case s.Peer:
			out = append(out, s.Name)
		}
	}
	return out
}

// groups are the group names a strategy list takes, in display order.
func groups() []Group {
	return []Group{{Name: GroupPeers, Words: "warden's best routings, vLLM's own balancer and every peer's router: " + strings.Join(HeadToHead(), ", "), specs: HeadToHead()}}
}

// Groups returns the group names a strategy list takes.
func Groups() []Group { return groups() }

// ExpandSpecs resolves a strategy list: each item is a spec (ParseSpec)
// or a group name, which stands for its members in the registry's order.
// A spec given twice, by name or through a group, is kept once, where it
// first appears. The error names the item that does not parse.
func ExpandSpecs(list []string) ([]string, error) {
	out := make([]string, 0, len(list))
	add := func(s string) {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	for _, item := range list {
		if i := slices.IndexFunc(groups(), func(g Group) bool { return g.Name == item }); i >= 0 {
			for _, s := range groups()[i].specs {
				add(s)
			}
			continue
		}
		if err := ValidSpec(item); err != nil {
			return nil, err
		}
		add(item)
	}
	return out, nil
}

// ValidSpec reports what is wrong with spec s, nil when it parses.
func ValidSpec(s string) error {
	_, err := ParseSpec(s)
	return err
}

// SpecLabel is the display name of spec s from the options its name
// gives: "affinity (kv, admit 30s)", "least-loaded"; s itself when it
// does not parse.
func SpecLabel(s string) string {
	sp, err := ParseSpec(s)
	if err != nil {
		return s
	}
	return sp.Label()
}

// On returns the options turned on, in the strategy's display order, each
// as "name" or "name value": ["kv", "admit 30s"].
func (s Spec) On() []string {
	var on []string
	add := func(b bool, w string) {
		if b {
			on = append(on, w)
		}
	}
	add(s.KV, "kv")
	add(s.Priced, "priced")
	if s.Admit {
		if s.AdmissionTimeout > 0 {
			on = append(on, "admit "+s.AdmissionTimeout.String())
		} else {
			on = append(on, "admit")
		}
	}
	add(s.Rehome, "rehome")
	add(s.Prefix, "prefix")
	return on
}

// Label is the display name, in tables and JSON: the options in the
// strategy's order, "affinity (kv, priced, admit 30s)"; with none, the
// strategy's name.
func (s Spec) Label() string {
	on := s.On()
	if len(on) == 0 {
		return s.Strategy
	}
	return s.Strategy + " (" + strings.Join(on, ", ") + ")"
}

// Apply turns the spec's options on in cfg (leaving the others as cfg
// has them: a farm's routing block, the proxy's defaults).
func (s Spec) Apply(cfg *Config) {
	if s.KV {
		cfg.Balance = BalanceKV
	}
	if s.Priced {
		cfg.Spill = SpillPriced()
	}
	if s.Admit {
		cfg.Admission = AdmissionKV
	}
	if s.Rehome {
		cfg.Rehome = RehomeCold
	}
	if s.Prefix {
		cfg.Prefix = PrefixHeld
	}
}

// EffectiveSpec is the spec of strategy with the options cfg has on (a
// farm's routing block and a spec's options applied), naming timeout as
// its admission timeout (0: not named). A strategy that takes no options
// gets a bare spec: cfg's fields are affinity's.
func EffectiveSpec(strategy string, cfg Config, timeout time.Duration) Spec {
	sp := Spec{Strategy: strategy}
	if st, ok := LookupStrategy(strategy); !ok || len(st.Options) == 0 {
		return sp
	}
	sp.KV = cfg.Balance == BalanceKV
	sp.Priced = cfg.Spill.Priced()
	sp.Admit = cfg.Admission == AdmissionKV
	sp.AdmissionTimeout = timeout
	sp.Rehome = cfg.Rehome == RehomeCold
	sp.Prefix = cfg.Prefix == PrefixHeld
	return sp
}

// Words says in plain words what strategy name does (Strategy.Words),
// "the NAME strategy" for a name the registry does not know.
func Words(name string) string {
	if s, ok := LookupStrategy(name); ok && s.Words != "" {
		return s.Words
	}
	return "the " + name + " strategy"
}

// OptionWords returns the clauses of the options spec s turns on, in
// display order, each in plain words (options whose Words are empty are
// left out).
func (s Spec) OptionWords() []string {
	st, ok := LookupStrategy(s.Strategy)
	if !ok {
		return nil
	}
	var probe Spec
	var out []string
	for _, o := range st.Options {
		probe = Spec{Strategy: s.Strategy}
		o.set(&probe, 0)
		if o.Words != "" && s.has(probe) {
			out = append(out, o.Words)
		}
	}
	return out
}

// has reports whether s turns on every option p turns on.
func (s Spec) has(p Spec) bool {
	return (!p.KV || s.KV) && (!p.Priced || s.Priced) && (!p.Admit || s.Admit) && (!p.Rehome || s.Rehome) && (!p.Prefix || s.Prefix)
}

// InferStrategy names the strategy the proxy served decisions counted by
// reason with (a reason's name to its count, as warden_requests_total's
// reason label says): of the strategies the proxy serves, the one with
// the most decisions under reasons that only it gives. ok is false when
// no such reason was counted.
func InferStrategy(counts map[string]float64) (name string, reasons []Reason, ok bool) {
	best := 0.0
	for _, s := range registry {
		if !s.Proxy {
			continue
		}
		var n float64
		var own []Reason
		for _, r := range s.Reasons {
			if givenByOthers(s, r) {
				continue
			}
			own = append(own, r)
			n += counts[r.String()]
		}
		if n > best {
			best, name, reasons, ok = n, s.Name, own, true
		}
	}
	return name, reasons, ok
}

// givenByOthers reports whether a strategy the proxy serves other than s
// gives reason r.
func givenByOthers(s *Strategy, r Reason) bool {
	for _, o := range registry {
		if o != s && o.Proxy && slices.Contains(o.Reasons, r) {
			return true
		}
	}
	return false
}

// plain returns a Strategy.New for a policy without configuration.
func plain(p func() Policy) func(Config) (Policy, error) {
	return func(Config) (Policy, error) { return p(), nil }
}
