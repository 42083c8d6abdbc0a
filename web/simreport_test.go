package web

import (
	"bytes"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lm-warden/warden/metrics"
	"github.com/lm-warden/warden/sim"
)

// sampleSimResult is a small result in the simulator's shape: three strategies, three steps,
// two replicas, one cell without a TTFB (NaN) and one strategy missing a step.
func sampleSimResult() *sim.Report {
	rep := &sim.Report{Farm: "2x H100-80GB, Qwen3-32B"}
	strategies := []string{"hash", "least-loaded", "affinity"}
	for _, n := range []int{8, 16, 32} {
		for si, s := range strategies {
			if s == "hash" && n == 16 {
				continue
			}
			f := float64(n) / 8
			row := sim.Row{
				Strategy: s, Sessions: n,
				SessionsPerHour:    sim.Float(120 * f),
				OutputTokensPerMin: sim.Float(9000*f - 500*float64(si)),
				TTFBP50:            sim.Float(0.1 * f * float64(3-si)),
				TTFBP95:            sim.Float(0.4 * f * float64(3-si)),
				ReplicasBusy:       sim.Float(math.Min(2, 0.5*f)),
				PrefixHitPct:       sim.Float(50 + 15*float64(si)),
				StayedPct:          sim.Float(60 + 20*float64(si)),
				MissTokens:         sim.MissTokens{Cold: 1000, Evicted: int64(500 * (3 - si)), Elsewhere: int64(2000 * (2 - si)), Partial: 300},
				Finished:           int64(100 * n), Unfinished: int64(si), Preemptions: int64(2 - si),
			}
			if s == "least-loaded" && n == 32 {
				row.TTFBP95 = sim.Float(math.NaN())
			}
			for r := range 2 {
				row.Replicas = append(row.Replicas, sim.ReplicaRow{
					Replica: r, Requests: int64(50*n + 10*r), Sticky: int64(40 * n), SpilledIn: int64(r * si),
					KVUsageMean: sim.Float(0.3 + 0.1*float64(r)), KVUsageMax: sim.Float(0.9), HitPct: sim.Float(70 + float64(r)),
				})
			}
			rep.Rows = append(rep.Rows, row)
		}
	}
	return rep
}

func TestSimReport(t *testing.T) {
	r := SimReport(sampleSimResult(), SimReportOptions{Workload: []string{"32 agent sessions, 20k-token system prompt."}})
	wantAnswer := "At 32 sessions on 2x H100-80GB, Qwen3-32B, affinity routing gives the lowest TTFB p95, 1.60 s, " +
		"with a prefix-cache hit rate of 80.0 % (hash 4.80 s, least-loaded finished no request)."
	if r.Answer != wantAnswer {
		t.Errorf("Answer =\n%q\nwant\n%q", r.Answer, wantAnswer)
	}
	var ids []string
	for _, c := range r.Charts() {
		ids = append(ids, c.ID)
		got, err := c.OptionsJSON()
		if err != nil {
			t.Fatal(err)
		}
		checkGolden(t, filepath.Join("testdata", "sim-"+c.ID+".json"), got)
	}
	if got, want := strings.Join(ids, " "), "ttfb hit tokens busy miss replica-requests replica-hit replica-kv"; got != want {
		t.Errorf("chart ids %q, want %q", got, want)
	}
	var buf bytes.Buffer
	if err := r.Render(&buf); err != nil {
		t.Fatal(err)
	}
	html := buf.String()
	for _, want := range []string{
		"<td>32</td><td>affinity</td><td>480</td><td>35,000</td><td>0.40</td><td>1.60</td><td>2.0</td><td>80.0</td><td>100.0</td><td>3,200</td><td>2</td><td>0</td>",
		"<td>affinity</td><td>1</td><td>1,610</td><td>1,280</td><td>2</td><td>40.0</td><td>90.0</td><td>71.0</td><td>0</td>",
		"32 agent sessions, 20k-token system prompt.",
	} {
		if !strings.Contains(html, want) {
			t.Errorf("rendered report lacks %q", want)
		}
	}
	for _, k := range metrics.KPIs() {
		if !strings.Contains(html, "<span class=\"muted\">"+k.Name+"</span>") {
			t.Errorf("rendered report lacks the definition of KPI %s", k.Name)
		}
	}
}

func TestSimReportEmpty(t *testing.T) {
	r := SimReport(&sim.Report{Farm: "none"}, SimReportOptions{})
	if r.Answer != "The simulation produced no results." {
		t.Errorf("Answer = %q", r.Answer)
	}
	if err := r.Render(&bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
}

func TestFmtNum(t *testing.T) {
	tests := []struct {
		v    float64
		d    int
		want string
	}{
		{0, 0, "0"}, {999, 0, "999"}, {1000, 0, "1,000"}, {1234567.891, 2, "1,234,567.89"},
		{-12345, 1, "-12,345.0"}, {math.NaN(), 2, "-"}, {math.Inf(1), 0, "-"},
	}
	for _, tt := range tests {
		if got := fmtNum(tt.v, tt.d); got != tt.want {
			t.Errorf("fmtNum(%v, %d) = %q, want %q", tt.v, tt.d, got, tt.want)
		}
	}
}

func BenchmarkRenderSimReport(b *testing.B) {
	res := sampleSimResult()
	var buf bytes.Buffer
	b.ReportAllocs()
	for b.Loop() {
		buf.Reset()
		if err := SimReport(res, SimReportOptions{}).Render(&buf); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSimReportTimelines: a simulation with timelines draws the hit rate
// of every strategy over time and, per strategy, each replica's KV use
// and load.
func TestSimReportTimelines(t *testing.T) {
	rep := sampleSimResult()
	nan := sim.Float(math.NaN())
	rep.Timelines = []sim.Timeline{
		{Strategy: "hash", StepS: 300, TimesS: []float64{300, 600}, HitPct: []sim.Float{95, 31},
			KVUsagePct: [][]sim.Float{{20, 90}, {3, nan}}, InFlight: [][]sim.Float{{1, 6}, {0, 0}}},
		{Strategy: "affinity", StepS: 300, TimesS: []float64{300, 600}, HitPct: []sim.Float{96, 90},
			KVUsagePct: [][]sim.Float{{30, 50}, {25, 40}}, InFlight: [][]sim.Float{{1, 2}, {1, 2}}},
	}
	r := SimReport(rep, SimReportOptions{})
	var ids []string
	for _, c := range r.Charts() {
		if strings.HasPrefix(c.ID, "timeline") {
			ids = append(ids, c.ID)
		}
		if err := c.Err(); err != nil {
			t.Fatalf("chart %s: %v", c.ID, err)
		}
	}
	if got, want := strings.Join(ids, " "), "timeline-hit timeline-0-kv timeline-0-inflight timeline-1-kv timeline-1-inflight"; got != want {
		t.Errorf("timeline charts %q, want %q", got, want)
	}
	var buf bytes.Buffer
	if err := r.Render(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "Over time, from cold caches") {
		t.Error("no section for the timelines")
	}
}

// TestSimReportHeadToHead: with more strategies than lines can show
// (warden sim --strategies peers), the summary's charts are bars, one
// group per strategy and a bar per sessions level, the TTFB's p95 only;
// the answer names, beside the best, the best of warden's routings, of
// the peers and vLLM's own balancer (golden: testdata/sim-h2h-*.json).
func TestSimReportHeadToHead(t *testing.T) {
	rep := &sim.Report{Farm: "4x RTX A4000, Qwen3-4B"}
	strategies := []string{"least-loaded", "affinity", "affinity (kv, priced, admit)", "llm-d", "dynamo", "sglang"}
	for _, n := range []int{8, 24} {
		for i, s := range strategies {
			rep.Rows = append(rep.Rows, sim.Row{Strategy: s, Sessions: n,
				TTFBP95:            sim.Float(float64(n) * float64(1+(i*5)%7) / 4),
				PrefixHitPct:       sim.Float(30 + 10*float64(i)),
				OutputTokensPerMin: sim.Float(1000 * float64(n+i)),
				ReplicasBusy:       sim.Float(2 + float64(i%3)),
			})
		}
	}
	r := SimReport(rep, SimReportOptions{})
	want := "At 24 sessions on 4x RTX A4000, Qwen3-4B, least-loaded routing gives the lowest TTFB p95, 6.00 s, with a prefix-cache hit rate of 30.0 % " +
		"(warden's best, affinity (kv, priced, admit), 24.00 s at 50.0 % hit, the best peer, llm-d, 12.00 s at 60.0 % hit)."
	if r.Answer != want {
		t.Errorf("Answer =\n%q\nwant\n%q", r.Answer, want)
	}
	var ids []string
	for _, c := range r.Charts()[:4] {
		ids = append(ids, c.ID)
		got, err := c.OptionsJSON()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(got), `"type": "bar"`) || !strings.Contains(string(got), `"name": "24 sessions"`) {
			t.Errorf("chart %s is not bars per sessions level:\n%.300s", c.ID, got)
		}
		checkGolden(t, filepath.Join("testdata", "sim-h2h-"+c.ID+".json"), got)
	}
	if got := strings.Join(ids, " "); got != "ttfb hit tokens busy" {
		t.Errorf("chart ids %q", got)
	}
	if err := r.Render(&bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	// When warden's routing is the best, the answer names its runner-up.
	for i := range rep.Rows {
		if rep.Rows[i].Strategy == "affinity" && rep.Rows[i].Sessions == 24 {
			rep.Rows[i].TTFBP95 = 1
		}
	}
	if got := SimReport(rep, SimReportOptions{}).Answer; !strings.Contains(got, "affinity routing gives the lowest TTFB p95, 1.00 s") ||
		!strings.Contains(got, "warden's next best, affinity (kv, priced, admit), 24.00 s") {
		t.Errorf("Answer = %q", got)
	}
}
