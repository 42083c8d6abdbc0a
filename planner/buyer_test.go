package planner

import (
	"strings"
	"testing"

	"github.com/lm-warden/warden/sim"
)

// TestBuyerCheck: a marginal answer whose KV cache and speed are estimated
// tells a buyer what to rent for an hour and the exact commands (the vLLM
// release, engine arguments and dtypes the plan simulated), and the margin
// to buy instead; a candidate measured already (no band axis) gets none.
func TestBuyerCheck(t *testing.T) {
	p := Plan{
		Farms: []FarmSet{{GPUs: []string{"h100"}, Replicas: []int{1, 2}, TensorParallelSizes: []int{4}, Model: "llama-3.1-70b",
			WeightsDType: "fp8", KVCacheDType: "fp8", VLLM: sim.VLLMSpec{MaxModelLen: 32768}}},
		prices: map[string]float64{"H100 SXM": 4.76},
	}
	marginal := Candidate{Name: "4 x H100 SXM (1 replica at TP 4)", GPU: "H100 SXM", Model: "meta-llama/Llama-3.1-70B-Instruct",
		Replicas: 1, TensorParallelSize: 4, Cards: 4, Cost: 19.04, MaxNumSeqs: 1024, VLLMRelease: "0.26", Verdict: VerdictMarginal, KVBand: true, SpeedBand: true}
	best := Candidate{Name: "8 x H100 SXM (2 replicas at TP 4)", GPU: "H100 SXM", Model: marginal.Model, Replicas: 2, TensorParallelSize: 4, Cards: 8, Cost: 38.08, Verdict: VerdictMeets}
	res := &Result{Concurrency: 40, CostUnit: "per hour", Prices: []PriceUsed{{GPU: "H100 SXM", PerGPUHour: 4.76, From: PriceFromCatalogue}},
		Candidates: []Candidate{marginal, best}, Best: 1, Closest: -1, Marginal: []int{0}}
	bc := buyerCheck(p, res)
	if bc == nil {
		t.Fatal("no check for a marginal answer")
	}
	if want := "4 x H100 SXM in one machine for an hour, about 19.04 USD"; bc.Rent != want {
		t.Errorf("rent %q, want %q", bc.Rent, want)
	}
	var cmds []string
	for _, s := range bc.Steps {
		cmds = append(cmds, s.Command)
	}
	all := strings.Join(cmds, "\n")
	for _, want := range []string{
		`pip install "vllm==0.26.*"`,
		"vllm serve meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-size 4 --max-num-seqs 1024 --max-model-len 32768 --quantization fp8 --kv-cache-dtype fp8",
		"warden bench --target http://HOST:8000 --model meta-llama/Llama-3.1-70B-Instruct --sessions 20,40 --step 15m",
		`warden calibrate --prometheus http://localhost:9090 --model meta-llama/Llama-3.1-70B-Instruct --gpu "H100 SXM" --max-num-seqs 1024 --since 1h --out farm.yaml`,
	} {
		if !strings.Contains(all, want) {
			t.Errorf("commands lack %q:\n%s", want, all)
		}
	}
	if want := "Or buy the margin instead: 8 x H100 SXM (2 replicas at TP 4) meets at the band's pessimistic edge, for 19.04 more per hour."; bc.Margin != want {
		t.Errorf("margin %q, want %q", bc.Margin, want)
	}
	// Measured already: num_gpu_blocks given and step_time calibrated.
	res.Candidates[0].KVBand, res.Candidates[0].SpeedBand = false, false
	if bc := buyerCheck(p, res); bc != nil {
		t.Errorf("a measured candidate got a check: %+v", bc)
	}
	// Nothing marginal: nothing to decide.
	res.Candidates[0].KVBand, res.Marginal = true, nil
	if bc := buyerCheck(p, res); bc != nil {
		t.Errorf("no marginal candidate, yet a check: %+v", bc)
	}
}
