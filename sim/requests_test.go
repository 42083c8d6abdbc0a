package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/internal/num"
	"github.com/lm-warden/warden/traces"
)

// TestRequestRecordsMatchTheTable runs the product's five steps of 3
// minutes with --requests and checks the records against the table:
// every request sent has one record; the exact TTFB percentiles of each
// step's records equal the table's PromQL p50/p95 within 2 % (and the
// direct counts exactly); the load carries on across steps, so sessions
// complete at 24 and 32 sessions too; censored TTFBs are flagged.
func TestRequestRecordsMatchTheTable(t *testing.T) {
	if testing.Short() {
		t.Skip("15 simulated minutes per strategy")
	}
	var buf bytes.Buffer
	e := Experiment{Farm: mustDefaultFarm(t), Sessions: DefaultSessions, Duration: DefaultDuration, Seed: 1, Requests: &buf}
	rep, err := Run(context.Background(), e)
	if err != nil {
		t.Fatal(err)
	}
	type key struct {
		strategy string
		sessions int
	}
	ttfbs := map[key][]float64{}
	censored := map[key]int64{}
	var lines, finished int64
	sc := bufio.NewScanner(&buf)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec RequestRecord
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("line %d: %v", lines+1, err)
		}
		lines++
		k := key{rec.Strategy, rec.Sessions}
		if v := float64(rec.TTFBS); !math.IsNaN(v) {
			ttfbs[k] = append(ttfbs[k], v)
		}
		if rec.Censored {
			censored[k]++
		}
		if rec.Finished {
			finished++
			if math.IsNaN(float64(rec.FinishS)) || rec.OutputTokens < 1 || rec.Replica < 0 || rec.Reason == "" {
				t.Errorf("finished record with missing fields: %s", sc.Bytes())
			}
		}
	}
	var rowsFinished, rowsUnfinished int64
	for _, row := range rep.Rows {
		rowsFinished += row.Finished
		rowsUnfinished += row.Unfinished
		k := key{row.Strategy, row.Sessions}
		name := fmt.Sprintf("%s/%d", row.Strategy, row.Sessions)
		v := slices.Clone(ttfbs[k])
		slices.Sort(v)
		p50, p95 := num.Quantile(v, 0.5), num.Quantile(v, 0.95)
		// Records carry milliseconds (3 decimals).
		if math.Abs(p50-row.direct.ttfbP50) > 1e-3 || math.Abs(p95-row.direct.ttfbP95) > 1e-3 {
			t.Errorf("%s: records p50/p95 %v/%v, direct counts %v/%v", name, p50, p95, row.direct.ttfbP50, row.direct.ttfbP95)
		}
		for _, c := range []struct {
			what       string
			got, exact float64
		}{{"p50", float64(row.TTFBP50), p50}, {"p95", float64(row.TTFBP95), p95}} {
			if rel := math.Abs(c.got-c.exact) / c.exact; !(rel <= 0.02) {
				t.Errorf("%s: table TTFB %s %.4f s, exact %.4f s from the records (%.1f %% off, want <= 2 %%)", name, c.what, c.got, c.exact, 100*rel)
			}
		}
		if censored[k] != row.Censored {
			t.Errorf("%s: %d censored records, the row says %d", name, censored[k], row.Censored)
		}
		if row.Sessions >= 24 && !(row.SessionsPerHour > 0) {
			t.Errorf("%s: sessions/h %v, want > 0: the load must carry on across steps", name, row.SessionsPerHour)
		}
	}
	if lines != rowsFinished+rowsUnfinished || finished != rowsFinished {
		t.Errorf("%d records (%d finished), the rows count %d finished + %d unfinished", lines, finished, rowsFinished, rowsUnfinished)
	}
}

// TestStepsCarryTheLoadOn checks the step transitions: the level goes up
// and down while the sessions in progress carry on, so a session started
// in one step finishes in the next, and the concurrency follows the level.
func TestStepsCarryTheLoadOn(t *testing.T) {
	var buf bytes.Buffer
	e := Experiment{Farm: mustDefaultFarm(t), Strategies: []string{"affinity"}, Sessions: []int{4, 8, 2}, Duration: 40 * time.Second, Seed: 2, Requests: &buf}
	rep, err := Run(context.Background(), e)
	if err != nil {
		t.Fatal(err)
	}
	first := map[string]float64{} // session -> arrival of its first turn
	spans := 0                    // sessions with turns in two steps
	steps := map[string]map[int]bool{}
	sc := bufio.NewScanner(&buf)
	for sc.Scan() {
		var rec RequestRecord
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Turn == 0 {
			first[rec.Session] = float64(rec.ArrivalS)
		}
		if steps[rec.Session] == nil {
			steps[rec.Session] = map[int]bool{}
		}
		steps[rec.Session][rec.Sessions] = true
	}
	for _, st := range steps {
		if len(st) > 1 {
			spans++
		}
	}
	if spans == 0 {
		t.Error("no session has turns in two steps: the steps cut the load")
	}
	// Sessions started per step: 4 at 0 s, then 4 more at 40 s (and the
	// replacements of those that end), none new while retiring to 2.
	started := [3]int{}
	for _, at := range first {
		started[min(int(at/40), 2)]++
	}
	if started[0] < 4 || started[1] < 4 {
		t.Errorf("sessions started per step %v, want at least 4 and 4 more", started)
	}
	if got := rep.Rows[2].Unfinished; got > 2 {
		t.Errorf("last step at level 2 cut %d requests, want at most 2", got)
	}
}

// TestStepsGolden is the transcript of three short steps (2, then 3, then
// 1 session) as the product's bench runs them (sim/testdata/validation:
// "the load carried on from step to step, sessions are not cut at a step
// boundary"): which session sent which turn in which step, where it went,
// when its first token came and whether its TTFB was counted censored.
// go test ./sim -run TestStepsGolden -update rewrites it.
func TestStepsGolden(t *testing.T) {
	var buf bytes.Buffer
	w := traces.DefaultWorkload()
	w.FirstMessageTokens, w.Turns = 2000, 3
	e := Experiment{Farm: mustDefaultFarm(t), Strategies: []string{"affinity"}, Workload: w, Sessions: []int{2, 3, 1}, Duration: 15 * time.Second, Seed: 1, Requests: &buf}
	if _, err := Run(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	fmt.Fprintln(&out, "# session turn | step level | replica reason | sent s, TTFB s, finished s | censored")
	sc := bufio.NewScanner(&buf)
	for sc.Scan() {
		var r RequestRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&out, "%s %d | %d | %d %s | %.3f %.3f %.3f | %v\n", r.Session, r.Turn, r.Sessions, r.Replica, r.Reason, float64(r.ArrivalS), float64(r.TTFBS), float64(r.FinishS), r.Censored)
	}
	checkGolden(t, filepath.Join("testdata", "steps", "carry_on.golden"), out.String())
}

// TestTextSaysCensoredAndAdmissionHits: the text report says how many TTFBs
// were counted censored, and gives the true admission hit % where vLLM's
// counters (before 0.24) count more.
func TestTextSaysCensoredAndAdmissionHits(t *testing.T) {
	f := mustDefaultFarm(t)
	f.Behaviour.StatsAtAdmission = false
	rep, err := Run(context.Background(), Experiment{Farm: f, Strategies: []string{"affinity"}, Sessions: []int{24, 32}, Duration: time.Minute, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := rep.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"TTFBs counted censored", "24 affinity: ", "true prefix hit % at admission"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the text lacks %q:\n%s", want, out.String())
		}
	}
}
