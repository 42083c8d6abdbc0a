package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/lm-warden/warden/placement"
)

// TestLookupMemoChangesNothing: the memo of a blocked request's lookup
// (replica.longestHit) is a shortcut, not a model change: the report and
// every request record are byte for byte those of walking the hashes
// afresh at every step, on farms at and past the KV cliff.
func TestLookupMemoChangesNothing(t *testing.T) {
	tight := mustDefaultFarm(t)
	tight.NumGPUBlocks = 1500
	cases := []Experiment{
		{Farm: mustDefaultFarm(t), Sessions: []int{16, 32}, Duration: time.Minute, Seed: 2},
		{Farm: tight, Strategies: placement.Strategies(), Sessions: []int{12}, Duration: time.Minute, Seed: 3},
		{Farm: mustExampleFarm(t, "rtx5090-gemma3-27b-int4.yaml"), Workload: Workload58k(), Strategies: []string{placement.StrategyAffinity}, Sessions: []int{26}, Duration: 5 * time.Minute, Seed: 1},
	}
	run := func(e Experiment, memo bool) (string, string) {
		noLookupMemo = !memo
		defer func() { noLookupMemo = false }()
		var reqs bytes.Buffer
		e.Requests = &reqs
		rep, err := Run(context.Background(), e)
		if err != nil {
			t.Fatal(err)
		}
		out, err := json.Marshal(rep)
		if err != nil {
			t.Fatal(err)
		}
		return string(out), reqs.String()
	}
	for i, e := range cases {
		a, ra := run(e, true)
		b, rb := run(e, false)
		if a != b {
			t.Errorf("case %d: the report differs with the memo:\n%s", i, cmp.Diff(b, a))
		}
		if ra != rb {
			t.Errorf("case %d: the request records differ with the memo", i)
		}
	}
}
