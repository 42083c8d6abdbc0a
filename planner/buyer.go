package planner

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/lm-warden/warden/hardware"
)

// BuyerCheck is advice a buyer can follow when the answer hangs on what
// the band does not know (a marginal candidate, whose KV cache or engine
// speed is estimated): rent one replica of it for an hour and measure
// the two figures that decide, or buy the margin instead. Someone who
// runs the card already reads them off it (warden plan --prometheus).
type BuyerCheck struct {
	Candidate string `json:"candidate"` // the marginal candidate the answer names
	// Rent is what to rent, e.g. "4 x H100 SXM in one machine (one
	// replica of 4 x H100 SXM (1 replica at TP 4)) for an hour".
	Rent string `json:"rent"`
	// Steps are what to run, in order: install the release simulated,
	// start vLLM as the plan simulated it, scrape it, load it with the
	// plan's sessions, calibrate.
	Steps []BuyerStep `json:"steps"`
	// Then says how the measurement goes back into the plan.
	Then string `json:"then"`
	// Margin is what to buy instead of measuring ("" when the plan has no
	// candidate that meets at the band's pessimistic edge).
	Margin string `json:"margin,omitempty"`
}

// BuyerStep is one step of a BuyerCheck: why, and the command ("" for a
// step that is not one command).
type BuyerStep struct {
	Why     string `json:"why"`
	Command string `json:"command,omitempty"`
}

// buyerCheck is the check of the marginal candidate the answer names (the
// first cheaper marginal one, or the closest when none meets), nil when
// there is none or its figures are measured already (no KV or speed axis
// in its band).
func buyerCheck(p Plan, res *Result) *BuyerCheck {
	i := -1
	switch {
	case len(res.Marginal) > 0:
		i = res.Marginal[0]
	case res.Best < 0 && res.Closest >= 0 && res.Candidates[res.Closest].Verdict == VerdictMarginal:
		i = res.Closest
	}
	if i < 0 {
		return nil
	}
	c := &res.Candidates[i]
	if !c.KVBand && !c.SpeedBand {
		return nil
	}
	set, ok := p.farmSetOf(c)
	if !ok {
		return nil
	}
	tp := max(c.TensorParallelSize, 1)
	rent := fmt.Sprintf("%d x %s in one machine", tp, c.GPU)
	if c.Replicas > 1 {
		rent += fmt.Sprintf(" (one of the %d replicas of %s)", c.Replicas, c.Name)
	}
	rent += " for an hour"
	if price, ok := p.prices[c.GPU]; ok {
		rent += fmt.Sprintf(", about %s", fmtCost(price*float64(tp)))
		if res.Prices != nil && res.Prices[0].From == PriceFromCatalogue {
			rent += " USD"
		}
	}
	serve := []string{"vllm serve", c.Model, "--tensor-parallel-size", strconv.Itoa(tp), "--max-num-seqs", strconv.Itoa(c.MaxNumSeqs)}
	if v := set.VLLM.MaxNumBatchedTokens; v > 0 {
		serve = append(serve, "--max-num-batched-tokens", strconv.Itoa(v))
	}
	if v := set.VLLM.MaxModelLen; v > 0 {
		serve = append(serve, "--max-model-len", strconv.Itoa(v))
	}
	if v := set.VLLM.GPUMemoryUtilization; v > 0 {
		serve = append(serve, "--gpu-memory-utilization", strconv.FormatFloat(v, 'f', -1, 64))
	}
	if v := set.VLLM.BlockSize; v > 0 && v != 16 {
		serve = append(serve, "--block-size", strconv.Itoa(v))
	}
	model := c.Model
	switch hardware.DType(set.WeightsDType) {
	case hardware.FP8:
		serve = append(serve, "--quantization", "fp8")
	case hardware.INT4:
		model = "an int4 (AWQ or GPTQ) checkpoint of " + c.Model
		serve[1] = "INT4_CHECKPOINT"
	}
	if set.KVCacheDType == string(hardware.FP8) {
		serve = append(serve, "--kv-cache-dtype", "fp8")
	}
	perReplica := max(1, (res.Concurrency+c.Replicas-1)/c.Replicas)
	levels := strconv.Itoa(perReplica)
	if half := perReplica / 2; half >= 1 && half < perReplica {
		levels = strconv.Itoa(half) + "," + levels
	}
	steps := []BuyerStep{
		{Why: "the release the plan simulated", Command: fmt.Sprintf(`pip install "vllm==%s.*"`, c.VLLMRelease)},
		{Why: model + ", as the plan simulated it; its log gives the KV cache's size", Command: strings.Join(serve, " ")},
		{Why: "scrape it: a Prometheus server with scrape_configs: [{job_name: vllm, scrape_interval: 1s, static_configs: [{targets: ['HOST:8000']}]}]"},
		{Why: fmt.Sprintf("load it with this replica's share of the %d sessions, and half of it, for 15 minutes each", res.Concurrency),
			Command: fmt.Sprintf("warden bench --target http://HOST:8000 --model %s --sessions %s --step 15m", c.Model, levels)},
		{Why: "read its KV cache and fit its step time",
			Command: fmt.Sprintf("warden calibrate --prometheus http://localhost:9090 --model %s --gpu %q --max-num-seqs %d --since 1h --out farm.yaml", c.Model, c.GPU, c.MaxNumSeqs)},
	}
	if c.VLLMRelease == "" {
		steps = steps[1:]
	}
	check := &BuyerCheck{
		Candidate: c.Name,
		Rent:      rent,
		Steps:     steps,
		Then: "farm.yaml holds the measured num_gpu_blocks and the fitted step_time: put them in the plan file's farm " +
			"(vllm: {num_gpu_blocks: N}, step_time: {...}) and plan again; the band then drops those two unknowns and the verdict is decided.",
	}
	if res.Best >= 0 && res.Best != i {
		b := &res.Candidates[res.Best]
		more := fmt.Sprintf("%d more cards", b.Cards-c.Cards)
		if res.CostUnit != "cards" {
			more = fmtCost(b.Cost-c.Cost) + " more per hour"
		}
		check.Margin = fmt.Sprintf("Or buy the margin instead: %s meets at the band's pessimistic edge, for %s.", b.Name, more)
	}
	return check
}

// farmSetOf is the plan's farm set that holds candidate c (its GPU, model,
// replicas and tensor parallel size).
func (p Plan) farmSetOf(c *Candidate) (FarmSet, bool) {
	for _, f := range p.Farms {
		for _, g := range f.GPUs {
			gpu, err := hardware.LookupGPU(g)
			if err != nil || gpu.Name != c.GPU {
				continue
			}
			model := f.Model
			if m, err := hardware.LookupModel(f.Model); err == nil {
				model = m.Name
			}
			if f.ModelConfig == "" && model != c.Model {
				continue
			}
			tps := f.TensorParallelSizes
			if len(tps) == 0 {
				tps = []int{1}
			}
			if slices.Contains(tps, max(c.TensorParallelSize, 1)) && slices.Contains(f.Replicas, c.Replicas) {
				return f, true
			}
		}
	}
	return FarmSet{}, false
}

// Lead is the check's first sentence.
func (b *BuyerCheck) Lead() string {
	return fmt.Sprintf("To decide %s before buying it, rent %s and run, in order:", b.Candidate, b.Rent)
}
