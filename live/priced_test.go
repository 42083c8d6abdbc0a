package live

import (
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/internal/fakevllm"
)

// TestPricedSpill: spill_threshold: priced in the proxy, against real HTTP
// fakes. Conversation x is homed on replica 0 and w on replica 1; while
// replica 1 is down, k new conversations are placed on replica 0 and held
// there before their first token (replica 0's prefill queue: their
// uncached prompts). Replica 1 comes back and x sends its next turn: it
// leaves home only when the expected time to first token there, (queue +
// its uncached tokens) / rate, exceeds recomputing its whole prompt on
// replica 1 by the hysteresis (placement.PricedMarginSec, ...Frac), with
// the rates from prefill_tokens_per_s or measured from each fake's
// vllm:request_prefill_time_seconds. The spill reason in /api/status
// names both prices.
func TestPricedSpill(t *testing.T) {
	for _, tt := range []struct {
		name         string
		rate         string  // prefill_tokens_per_s
		rateA, rateB float64 // the fakes' prefill rates (their metrics); 0: no histogram
		queued       int     // new conversations held on replica 0
		wantSpill    bool
	}{
		// home (4 x ~560 + ~50) / 1000 = 2.3 s vs ~570 / 1000 = 0.6 s elsewhere.
		{"config, a queue of 4 at home: spills", "1000", 0, 0, 4, true},
		// home (~560 + ~50) / 1000 = 0.6 s vs 0.6 s: within the margin.
		{"config, a queue of 1 at home: stays", "1000", 0, 0, 1, false},
		// The same queue of 1, but home measures 200 tokens/s and the
		// other replica 2,000: home ~3 s vs 0.3 s elsewhere.
		{"metrics, a slow home: spills", "metrics", 200, 2000, 1, true},
		// The servers expose no prefill histogram: no rate, so the turn is
		// not priced and the spill threshold (auto: 64 in flight) keeps it.
		{"metrics, no histogram: not priced, stays", "metrics", 0, 0, 4, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, b := fakevllm.New(t, 1), fakevllm.New(t, 1)
			a.PrefillRate, b.PrefillRate = tt.rateA, tt.rateB
			a.HoldFirst = make(chan struct{})
			released := false
			release := func() {
				if !released {
					released = true
					close(a.HoldFirst)
				}
			}
			defer release()
			h := startProxy(t, modelsYAML("", urlsModel(a.URL(), b.URL())+"    spill_threshold: priced\n    prefill_tokens_per_s: "+tt.rate+"\n"))
			h.scraped()
			for _, s := range []string{"x", "w"} { // x on replica 0, w on 1 (fewest conversations)
				if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, s, 0, false), sessionHdr(s)); r.status != 200 {
					t.Fatalf("%s turn 0: status %d %s", s, r.status, r.body)
				}
			}
			if sa, sb := a.Served()[0], b.Served()[0]; sa != 1 || sb != 1 {
				t.Fatalf("served %d and %d, want x on replica 0 and w on replica 1", sa, sb)
			}
			if tt.rateA > 0 {
				st := h.waitFor("both rates measured", func(st StatusReport) bool {
					rs := st.Models[0].Replicas
					return rs[0].PrefillTokensPerSec != nil && rs[1].PrefillTokensPerSec != nil
				})
				for i, want := range []float64{tt.rateA, tt.rateB} {
					rs := st.Models[0].Replicas[i]
					if got := *rs.PrefillTokensPerSec; got < want*0.999 || got > want*1.001 || rs.PrefillSource != "metrics" {
						t.Errorf("replica %d: prefill rate %g from %q, want %g measured (metrics)", i, got, rs.PrefillSource, want)
					}
				}
			}
			b.HealthDown.Store(true)
			h.waitFor("replica 1 down", func(st StatusReport) bool { return st.Models[0].Replicas[1].State == "down" })
			var held []<-chan resp
			for i := range tt.queued {
				s := "queued-" + strconv.Itoa(i)
				held = append(held, h.doAsync("/v1/chat/completions", chatBody(testModel, s, 0, true), sessionHdr(s)))
			}
			h.waitFor("the new conversations in replica 0's prefill queue", func(st StatusReport) bool {
				r0 := st.Models[0].Replicas[0]
				return r0.InFlight == int64(tt.queued) && r0.PrefillQueueTokens > 0 && a.Served()[0] == 1+tt.queued
			})
			b.HealthDown.Store(false)
			h.waitFor("replica 1 back", func(st StatusReport) bool { return st.Models[0].Replicas[1].State == "healthy" })
			if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "x", 1, false), sessionHdr("x")); r.status != 200 {
				t.Fatalf("x turn 1: status %d %s", r.status, r.body)
			}
			spilled := b.Served()[0] == 2
			if stayed := a.Served()[0] == 2+tt.queued; spilled == stayed {
				t.Fatalf("x's turn served by both or neither: replica 0 %d, replica 1 %d", a.Served()[0], b.Served()[0])
			}
			st := h.status().Models[0]
			if spilled != tt.wantSpill {
				t.Errorf("x's turn spilled %v, want %v (status: queue %d on replica 0, rates %v and %v, spill reasons %+v)", spilled, tt.wantSpill,
					st.Replicas[0].PrefillQueueTokens, st.Replicas[0].PrefillTokensPerSec, st.Replicas[1].PrefillTokensPerSec, st.SpillReasons)
			}
			if !st.SpillPriced {
				t.Errorf("status spill_priced false, want true")
			}
			if tt.wantSpill {
				priced := regexp.MustCompile(`^priced: home (\d+\.\d) s vs (\d+\.\d) s elsewhere$`)
				if len(st.SpillReasons) != 1 {
					t.Fatalf("spill reasons %+v, want one", st.SpillReasons)
				}
				sr := st.SpillReasons[0]
				m := priced.FindStringSubmatch(sr.Reason)
				if m == nil || sr.From != 0 || sr.To != 1 {
					t.Fatalf("spill reason %+v, want from 0 to 1 and \"priced: home H s vs E s elsewhere\"", sr)
				}
				home, _ := strconv.ParseFloat(m[1], 64)
				other, _ := strconv.ParseFloat(m[2], 64)
				if home <= other+0.5 {
					t.Errorf("spill reason %q: home must exceed elsewhere by the margin", sr.Reason)
				}
			} else if len(st.SpillReasons) != 0 {
				t.Errorf("spill reasons %+v, want none", st.SpillReasons)
			}
			if tt.rate == "metrics" && tt.rateA == 0 && !strings.Contains(strings.Join(st.Warnings, "\n"), "prefill") {
				t.Errorf("warnings %q, want one saying the replicas have no prefill rate", st.Warnings)
			}
			release()
			for _, c := range held {
				if r := <-c; r.status != 200 {
					t.Errorf("held conversation: status %d %s", r.status, r.body)
				}
			}
			if q := h.status().Models[0].Replicas[0].PrefillQueueTokens; q != 0 {
				t.Errorf("replica 0's prefill queue %d after every request ended, want 0", q)
			}
		})
	}
}

// TestPrefillMeter: the measured rate is the computed prompt tokens
// (prompt minus prefix-cache hits) over the prefill seconds across the
// last hour of samples; unknown before a finished request; kept through an
// hour without one; measured afresh after a counter reset; absent for a
// server without the histogram.
func TestPrefillMeter(t *testing.T) {
	at := func(s int) time.Time { return time.Unix(0, 0).Add(time.Duration(s) * time.Second) }
	type obs struct {
		t                               int // seconds
		prompt, hits, seconds, requests float64
	}
	for _, tt := range []struct {
		name string
		obs  []obs
		want float64
	}{
		{"no finished request", []obs{{0, 0, 0, 0, 0}, {10, 500, 0, 0, 0}}, 0},
		{"one request", []obs{{0, 0, 0, 0, 0}, {10, 1000, 200, 2, 1}}, 400},
		{"hits are not computed", []obs{{0, 100, 50, 1, 1}, {10, 1100, 550, 2, 2}, {20, 2100, 1050, 3, 3}}, 500},
		{"a cached request's time counts", []obs{{0, 0, 0, 0, 0}, {10, 1000, 0, 1, 1}, {20, 2000, 1000, 1.5, 2}}, 1000 / 1.5},
		{"nothing computed: unknown", []obs{{0, 0, 0, 0, 0}, {10, 1000, 1000, 0.2, 1}}, 0},
		// An hour at 1,000 tokens/s, then more than an hour at 4,000: the
		// first hour has left the window.
		{"the last hour", func() []obs {
			var o []obs
			var p, s float64
			for k := 0; k <= 1000; k++ {
				rate := 1000.0
				if k > 360 {
					rate = 4000
				}
				p, s = p+rate*0.5, s+0.5
				o = append(o, obs{10 * k, p, 0, s, float64(k + 1)})
			}
			return o
		}(), 4000},
		{"idle for an hour: kept", func() []obs {
			o := []obs{{0, 0, 0, 0, 0}, {10, 3000, 0, 1, 1}}
			for k := 2; k < 800; k++ {
				o = append(o, obs{10 * k, 3000, 0, 1, 1})
			}
			return o
		}(), 3000},
		{"counter reset", []obs{{0, 0, 0, 0, 0}, {10, 1000, 0, 1, 1}, {20, 50, 0, 0.1, 1}, {30, 650, 0, 0.4, 2}}, 2000},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var p prefillMeter
			for _, o := range tt.obs {
				p.observe(EngineStats{PromptTokens: o.prompt, PrefixHits: o.hits, PrefillSeconds: o.seconds, PrefillRequests: o.requests, HasPrefill: true}, at(o.t))
			}
			if got := p.tokensPerSec(); math.Abs(got-tt.want) > 1e-9*max(tt.want, 1) {
				t.Errorf("rate %g, want %g", got, tt.want)
			}
		})
	}
	var p prefillMeter
	p.observe(EngineStats{PromptTokens: 1000}, at(0))
	p.observe(EngineStats{PromptTokens: 2000}, at(10))
	if got := p.tokensPerSec(); got != 0 {
		t.Errorf("without the histogram: rate %g, want 0 (unknown)", got)
	}
}

// TestPricedConfig: spill_threshold: priced needs prefill_tokens_per_s (a
// rate or metrics) and strategy affinity; a bad rate is refused naming the
// file, line and field.
func TestPricedConfig(t *testing.T) {
	base := "listen: 127.0.0.1:0\nclient_api_keys: [k]\nmodels:\n  - name: m\n    replicas: [http://127.0.0.1:1]\n"
	for _, tt := range []struct {
		yaml, want string
		rate       PrefillRate
	}{
		{"    spill_threshold: priced\n    prefill_tokens_per_s: 2500\n", "", PrefillRate{PerS: 2500}},
		{"    spill_threshold: priced\n    prefill_tokens_per_s: 1.5e4\n", "", PrefillRate{PerS: 15000}},
		{"    spill_threshold: priced\n    prefill_tokens_per_s: metrics\n", "", PrefillRate{Metrics: true}},
		{"    prefill_tokens_per_s: 900\n", "", PrefillRate{PerS: 900}},
		{"    spill_threshold: priced\n", "c.yaml:6: models[0].spill_threshold: priced needs models[0].prefill_tokens_per_s: the replicas' prefill rate in tokens per second, or metrics", PrefillRate{}},
		{"    spill_threshold: priced\n    prefill_tokens_per_s: 0\n", `c.yaml:7: models[0].prefill_tokens_per_s: want a prefill rate in tokens per second (a number above 0, at most 1e+08) or metrics (measured on each replica from vLLM's metrics), got "0"`, PrefillRate{}},
		{"    prefill_tokens_per_s: -5\n", `c.yaml:6: models[0].prefill_tokens_per_s: want a prefill rate`, PrefillRate{}},
		{"    prefill_tokens_per_s: fast\n", `got "fast"`, PrefillRate{}},
		{"    prefill_tokens_per_s: .inf\n", `got ".inf"`, PrefillRate{}},
		{"    prefill_tokens_per_s: NaN\n", `got "NaN"`, PrefillRate{}},
		{"    prefill_tokens_per_s: 1e12\n", `at most 1e+08`, PrefillRate{}},
		{"    prefill_tokens_per_s: [1]\n", `models[0].prefill_tokens_per_s: want a prefill rate`, PrefillRate{}},
		{"    strategy: hash\n    spill_threshold: priced\n    prefill_tokens_per_s: 1000\n", "c.yaml:7: models[0].spill_threshold: priced needs strategy affinity", PrefillRate{}},
	} {
		cfg, err := ParseConfig("c.yaml", []byte(base+tt.yaml))
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%q: %v", tt.yaml, err)
		case tt.want == "" && cfg.Models[0].PrefillTokensPerS != tt.rate:
			t.Errorf("%q: rate %+v, want %+v", tt.yaml, cfg.Models[0].PrefillTokensPerS, tt.rate)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%q: error %v, want %q", tt.yaml, err, tt.want)
		}
	}
}
