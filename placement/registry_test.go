package placement

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRegistry: every strategy is complete (a name once, words, the
// reasons it gives, a factory whose policy gives only those reasons), and
// every option parses, labels and applies.
func TestRegistry(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range Registered() {
		if s.Name == "" || strings.ContainsAny(s.Name, "+= ,") || seen[s.Name] {
			t.Errorf("strategy name %q: empty, with a spec character, or twice", s.Name)
		}
		seen[s.Name] = true
		if s.Words == "" || len(s.Reasons) == 0 || s.New == nil {
			t.Errorf("%s: words %q, reasons %v, factory %v: want all three", s.Name, s.Words, s.Reasons, s.New != nil)
			continue
		}
		p, err := s.New(Config{})
		if err != nil || p == nil {
			t.Errorf("%s: New(Config{}) = %v, %v", s.Name, p, err)
			continue
		}
		// Its decisions on a small farm give only the reasons it lists.
		snap := Snapshot{Replicas: []Replica{{ID: 0, Healthy: true}, {ID: 1, Healthy: true}}, MaxNumSeqs: 4}
		now := time.Unix(0, 0)
		for i, session := range []string{"a", "b", "a", "c", "a"} {
			req := Request{Session: session, PromptTokens: 100, Pinned: NoPin}
			if i == 3 {
				req.Pinned = 1
			}
			d, err := p.Pick(&req, &snap, now)
			if err != nil {
				t.Fatalf("%s: pick %d: %v", s.Name, i, err)
			}
			if !containsReason(s.Reasons, d.Reason) {
				t.Errorf("%s: gave reason %s, not in its list %v", s.Name, d.Reason, s.Reasons)
			}
		}
		for _, o := range s.Options {
			sp, err := ParseSpec(s.Name + "+" + o.Name)
			if err != nil {
				t.Errorf("%s+%s: %v", s.Name, o.Name, err)
				continue
			}
			if on := sp.On(); len(on) != 1 || !strings.HasPrefix(on[0], o.Name) {
				t.Errorf("%s+%s turns on %v", s.Name, o.Name, on)
			}
			var cfg Config
			sp.Apply(&cfg)
			if cfg == (Config{}) {
				t.Errorf("%s+%s changes nothing in a Config", s.Name, o.Name)
			}
			if got := EffectiveSpec(s.Name, cfg, 0).Label(); got != sp.Label() {
				t.Errorf("%s+%s: the effective label %q differs from the spec's %q", s.Name, o.Name, got, sp.Label())
			}
		}
	}
	if got := strings.Join(Strategies(), ","); !strings.HasPrefix(got, "hash,least-loaded,affinity") {
		t.Errorf("Strategies() = %s: the product's three come first, in their order", got)
	}
	if _, err := New("random", Config{}); err == nil || !strings.Contains(err.Error(), `unknown strategy "random" (want one of hash, least-loaded, affinity`) {
		t.Errorf("New(random): %v", err)
	}
}

func containsReason(rs []Reason, r Reason) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}

// TestParseSpec: the option grammar, parsed once for warden sim, plan and
// tune: labels in display order, and an error naming what is wrong.
func TestParseSpec(t *testing.T) {
	for _, tt := range []struct{ spec, label, err string }{
		{"affinity", "affinity", ""},
		{"least-loaded", "least-loaded", ""},
		{"hash", "hash", ""},
		{"affinity+kv", "affinity (kv)", ""},
		{"affinity+admit+priced+kv", "affinity (kv, priced, admit)", ""},
		{"affinity+kv+admit=30s", "affinity (kv, admit 30s)", ""},
		{"affinity+admit=1m30s+priced", "affinity (priced, admit 1m30s)", ""},
		{"affinity+rehome+kv", "affinity (kv, rehome)", ""},
		{"affinity+rehome=1", "", `strategy "affinity+rehome=1": unknown option "rehome=1" (want kv, priced, admit, admit=TIMEOUT, rehome, prefix)`},
		{"affinity+admit=0s", "", `strategy "affinity+admit=0s": admit=0s: want an admission timeout > 0 such as admit=30s`},
		{"affinity+admit=soon", "", "admit=soon: want an admission timeout > 0"},
		{"affinity+fast", "", `unknown option "fast"`},
		{"affinity+", "", `unknown option ""`},
		{"hash+kv", "", `strategy "hash+kv": only affinity takes options (kv, priced, admit, admit=TIMEOUT, rehome, prefix)`},
		{"random", "", `unknown strategy "random" (want one of hash, least-loaded, affinity`},
		{"", "", `unknown strategy ""`},
	} {
		sp, err := ParseSpec(tt.spec)
		switch {
		case tt.err != "":
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%q: error %v, want %q", tt.spec, err, tt.err)
			}
			if got := SpecLabel(tt.spec); got != tt.spec {
				t.Errorf("SpecLabel(%q) = %q, want it unchanged", tt.spec, got)
			}
		case err != nil:
			t.Errorf("%q: %v", tt.spec, err)
		case sp.Label() != tt.label:
			t.Errorf("%q: label %q, want %q", tt.spec, sp.Label(), tt.label)
		}
	}
	sp, _ := ParseSpec("affinity+kv+admit=30s+rehome")
	if want := (Spec{Strategy: StrategyAffinity, KV: true, Admit: true, AdmissionTimeout: 30 * time.Second, Rehome: true}); sp != want {
		t.Errorf("parsed %+v, want %+v", sp, want)
	}
	var cfg Config
	sp.Apply(&cfg)
	if cfg.Balance != BalanceKV || cfg.Admission != AdmissionKV || cfg.Rehome != RehomeCold || cfg.Spill.Priced() {
		t.Errorf("applied %+v", cfg)
	}
	if got := strings.Join(sp.OptionWords(), "; "); !strings.Contains(got, "KV cache fill") || !strings.Contains(got, "waits at the proxy") || !strings.Contains(got, "evicted") {
		t.Errorf("option words %q", got)
	}
}

// TestInferStrategy: calibrate's reading of warden_requests_total's
// reasons picks the strategy with the most decisions under reasons only
// it gives; pinned, which every strategy gives, says nothing.
func TestInferStrategy(t *testing.T) {
	for _, tt := range []struct {
		counts map[string]float64
		want   string
		ok     bool
	}{
		{map[string]float64{"new": 3, "sticky": 40, "pinned": 2}, StrategyAffinity, true},
		{map[string]float64{"hash": 12, "pinned": 50}, StrategyHash, true},
		{map[string]float64{"least-loaded": 9}, StrategyLeastLoaded, true},
		{map[string]float64{"rehome": 1}, StrategyAffinity, true},
		{map[string]float64{"hash": 100, "new": 2}, StrategyHash, true}, // a change of strategy in the window: the most
		{map[string]float64{"pinned": 5}, "", false},
		{nil, "", false},
	} {
		got, reasons, ok := InferStrategy(tt.counts)
		if got != tt.want || ok != tt.ok || (ok && len(reasons) == 0) {
			t.Errorf("%v: %q %v %v, want %q %v", tt.counts, got, reasons, ok, tt.want, tt.ok)
		}
		for _, r := range reasons {
			if r == ReasonPinned {
				t.Errorf("%v: pinned counted as %s's own", tt.counts, got)
			}
		}
	}
}

// FuzzParseSpec: any string parses or is refused with an error naming it,
// and a spec that parses labels and applies without panicking; its
// canonical options parse again to the same spec.
func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{"affinity+kv+priced+admit=30s", "hash", "affinity+admit=1m", "affinity++", "least-loaded+kv", "affinity+admit=-1s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sp, err := ParseSpec(s)
		if err != nil {
			if !strings.Contains(err.Error(), strconv.Quote(s)) {
				t.Errorf("error %q does not name %q", err, s)
			}
			return
		}
		var cfg Config
		sp.Apply(&cfg)
		canon := sp.Strategy
		for _, o := range sp.On() {
			canon += "+" + strings.Replace(o, " ", "=", 1)
		}
		again, err := ParseSpec(canon)
		if err != nil || again != sp {
			t.Errorf("%q -> %q -> %+v, %v; want %+v", s, canon, again, err, sp)
		}
	})
}

func strconvQuote(s string) string { return strconv.Quote(s) }

// TestExpandSpecs: a strategy list takes the group "peers" (the
// head-to-head), keeps a spec given twice once, where it first appears,
// and names the item that does not parse.
func TestExpandSpecs(t *testing.T) {
	h2h := HeadToHead()
	if len(h2h) != len(PeerNames())+5 || h2h[0] != StrategyLeastLoaded || h2h[1] != StrategyAffinity {
		t.Fatalf("HeadToHead = %v, want least-loaded, warden's four routings, then the %d peers", h2h, len(PeerNames()))
	}
	for _, tc := range []struct {
		in      []string
		want    []string
		wantErr string
	}{
		{in: []string{"peers"}, want: h2h},
		{in: []string{"affinity+rehome", "peers"}, want: append([]string{"affinity+rehome"}, h2h...)},
		{in: []string{"dynamo", "peers", "dynamo"}, want: append([]string{"dynamo"}, slices.DeleteFunc(slices.Clone(h2h), func(s string) bool { return s == "dynamo" })...)},
		{in: []string{"hash", "hash"}, want: []string{"hash"}},
		{in: []string{"peers", "pears"}, wantErr: `unknown strategy "pears"`},
		{in: []string{"affinity+warp"}, wantErr: "affinity+warp"},
	} {
		got, err := ExpandSpecs(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ExpandSpecs(%v) error %v, want one naming %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ExpandSpecs(%v) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, s := range h2h {
		if err := ValidSpec(s); err != nil {
			t.Errorf("head-to-head spec %q: %v", s, err)
		}
	}
}
