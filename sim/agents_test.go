package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/traces"
)

// records runs e with its request records and returns them.
func records(t *testing.T, e Experiment) (*Report, []RequestRecord) {
	t.Helper()
	var buf bytes.Buffer
	e.Requests = &buf
	rep, err := Run(context.Background(), e)
	if err != nil {
		t.Fatal(err)
	}
	var out []RequestRecord
	sc := bufio.NewScanner(&buf)
	for sc.Scan() {
		var r RequestRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return rep, out
}

// TestSubagentsRunBesideTheirParent: a spawn starts its subagents together
// once the parent's request is answered, they run side by side, and the
// parent sends its next turn only when the last of them is done. They are
// not counted among the sessions.
func TestSubagentsRunBesideTheirParent(t *testing.T) {
	w := traces.DefaultWorkload()
	w.Turns, w.SubagentProbability, w.SubagentTurns, w.SubagentTaskTokens = 4, 1, 2, 500
	w.SubagentParallel = traces.TokenDist{Mean: 3}
	_, recs := records(t, Experiment{Farm: mustDefaultFarm(t), Strategies: []string{placement.StrategyAffinity},
		Sessions: []int{2}, Duration: 2 * time.Minute, Seed: 5, Workload: w})
	type key struct {
		session string
		turn    int
	}
	byKey := map[key]RequestRecord{}
	for _, r := range recs {
		if r.Finished {
			byKey[key{r.Session, r.Turn}] = r
		}
	}
	checked := 0
	for _, r := range recs {
		if strings.Contains(r.Session, ".sub") || r.Turn == 0 || !r.Finished {
			continue
		}
		// Parent turn r follows the three subagents spawned after turn-1.
		prev, ok := byKey[key{r.Session, r.Turn - 1}]
		if !ok {
			continue
		}
		var subEnd, firstStart float64 = 0, math.Inf(1)
		var starts []float64
		for n := 1; n <= 3*(w.Turns-1); n++ {
			id := r.Session + ".sub" + strconv.Itoa(n)
			first, ok1 := byKey[key{id, 0}]
			last, ok2 := byKey[key{id, 1}]
			if !ok1 || !ok2 || float64(first.ArrivalS) < float64(prev.FinishS) || float64(first.ArrivalS) > float64(r.ArrivalS) {
				continue // another spawn's
			}
			starts = append(starts, float64(first.ArrivalS))
			subEnd = math.Max(subEnd, float64(last.FinishS))
			firstStart = math.Min(firstStart, float64(first.ArrivalS))
		}
		if len(starts) != 3 {
			continue
		}
		for _, s := range starts {
			if s != firstStart {
				t.Fatalf("%s turn %d: subagents start at %v, not together", r.Session, r.Turn, starts)
			}
		}
		if float64(r.ArrivalS) < subEnd {
			t.Fatalf("%s turn %d sent at %.3f s, before its subagents were done (%.3f s)", r.Session, r.Turn, float64(r.ArrivalS), subEnd)
		}
		checked++
	}
	if checked < 3 {
		t.Fatalf("only %d parent turns after a spawn of 3 checked", checked)
	}
}

// TestShapedWorkloadSameSeedSameJSON: a workload of distributions, agent
// kinds, compaction and subagents under their parent's id gives the same
// bytes from the same seed (timelines included), other bytes from another.
func TestShapedWorkloadSameSeedSameJSON(t *testing.T) {
	cc, err := traces.Preset("claude-code")
	if err != nil {
		t.Fatal(err)
	}
	cc.Turns, cc.ContextLimit, cc.SubagentProbability = 20, 40000, 0.1
	cc.SummaryTokens = traces.TokenDist{Mean: 3000, Sigma: 0.5, Max: 8000}
	cx, _ := traces.Preset("codex")
	cx.Turns, cx.ContextLimit, cx.SubagentProbability = 15, 40000, 0.1
	cx.SummaryTokens = traces.TokenDist{Mean: 3000}
	w := traces.DefaultWorkload()
	w.Agents = []traces.Agent{{Name: "claude-code", Weight: 2, Shape: cc}, {Name: "codex", Weight: 1, Shape: cx}}
	if err := w.Validate(); err != nil {
		t.Fatal(err)
	}
	e := Experiment{Farm: mustDefaultFarm(t), Strategies: []string{placement.StrategyHash, placement.StrategyAffinity},
		Sessions: []int{4, 6}, Duration: 90 * time.Second, Seed: 11, Workload: w, TimelineStep: 30 * time.Second}
	rep, first := runJSON(t, e)
	if len(rep.Timelines) != 2 || len(rep.Timelines[0].TimesS) != 6 || len(rep.Timelines[1].KVUsagePct) != 4 {
		t.Fatalf("timelines %+v", rep.Timelines)
	}
	for _, r := range rep.Rows {
		if !(r.PausedPct > 0 && r.PausedPct < 100) {
			t.Fatalf("%s at %d: paused %v %%", r.Strategy, r.Sessions, r.PausedPct)
		}
	}
	if _, again := runJSON(t, e); !bytes.Equal(first, again) {
		t.Fatal("two runs with seed 11 differ")
	}
	e.Seed = 12
	if _, other := runJSON(t, e); bytes.Equal(other, first) {
		t.Fatal("seeds 11 and 12 give the same output")
	}
}

// runJSON runs e and returns its report and the report's JSON.
func runJSON(t *testing.T, e Experiment) (*Report, []byte) {
	t.Helper()
	rep, err := Run(context.Background(), e)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	return rep, b
}
