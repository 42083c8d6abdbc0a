package sim

import (
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/lm-warden/warden/hardware"
)

// TestStepTimeAllReduce works the tensor-parallel term by hand: 2 x layers
// + 1 all-reduces per step, each the link's latency plus 2 (TP-1)/TP of the
// step's hidden states over the link, half the link without peer access.
func TestStepTimeAllReduce(t *testing.T) {
	st := StepTime{PrefillEfficiency: 0.5, BandwidthEfficiency: 0.8, StepOverhead: Duration(100e3)}
	base := func(tp int, ic hardware.Interconnect) stepModel {
		d := toyDeployment(false)
		d.TensorParallelSize = tp
		d.GPU.Interconnect = ic
		return newStepModel(d, 0, st)
	}
	nvlink := hardware.Interconnect{Kind: "NVLink", BytesPerSec: 450e9, PeerToPeer: true, AllReduceLatencySec: 10e-6}
	host := hardware.Interconnect{Kind: "PCIe", BytesPerSec: 32e9, PeerToPeer: false, AllReduceLatencySec: 40e-6}
	const allReduces = 2*10 + 1 // toy: 10 layers
	const hiddenBytes = 1000 * 2.0
	for _, tt := range []struct {
		name  string
		tp    int
		ic    hardware.Interconnect
		batch []chunk
		want  float64 // seconds added to the same step at TP 1 with tp times the GPUs
	}{
		{"TP 1 has none", 1, nvlink, []chunk{{start: 0, n: 2048}}, 0},
		{"unknown interconnect adds none", 4, hardware.Interconnect{}, []chunk{{start: 0, n: 2048}}, 0},
		{"one decode over NVLink at TP 4", 4, nvlink, []chunk{{start: 999, n: 1}},
			allReduces * (10e-6 + 2*3.0/4*1*hiddenBytes/450e9)},
		{"a 2048-token chunk through host memory at TP 2", 2, host, []chunk{{start: 0, n: 2048}},
			allReduces * (40e-6 + 2*1.0/2*2048*hiddenBytes/16e9)},
		{"a mixed batch counts every token", 8, nvlink, []chunk{{start: 0, n: 100}, {start: 50, n: 1}, {start: 70, n: 1}},
			allReduces * (10e-6 + 2*7.0/8*102*hiddenBytes/450e9)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := base(tt.tp, tt.ic)
			none := m
			none.allReduceSec, none.allReduceSecPerToken = 0, 0
			got := m.seconds(tt.batch) - none.seconds(tt.batch)
			if math.Abs(got-tt.want) > 1e-12+1e-9*tt.want {
				t.Errorf("all-reduce time = %.9g s, want %.9g s", got, tt.want)
			}
			// The band's speed scale scales the communication too.
			if tt.want > 0 {
				fast := m.scaled(1.25)
				noneFast := none.scaled(1.25)
				if g := fast.seconds(tt.batch) - noneFast.seconds(tt.batch); math.Abs(g-tt.want/1.25) > 1e-12+1e-9*tt.want {
					t.Errorf("at speed x1.25: %.9g s, want %.9g s", g, tt.want/1.25)
				}
			}
		})
	}
}

// qwq32b is Qwen/QwQ-32B as its config.json gives it (Qwen2 architecture:
// 64 layers, hidden 5120, 40 query and 8 KV heads of 128, intermediate
// 27648, vocabulary 152064, embeddings not tied; 32.76e9 parameters).
func qwq32b() hardware.Model {
	return hardware.Model{
		Name: "Qwen/QwQ-32B", NumLayers: 64, HiddenSize: 5120, NumAttentionHeads: 40, NumKVHeads: 8,
		HeadDim: 128, ParamCount: 32_763_876_352, IntermediateSize: 27648, VocabSize: 152064,
		Source: "huggingface.co/Qwen/QwQ-32B config.json",
	}
}

// TestTensorParallelAgainstPublished simulates vllm-project/vllm#16300's
// benchmark_latency runs (testdata/tp: QwQ-32B on A100 80GB, 1 input token
// and 200 output tokens, batch 1 and 16, TP 2, 4 and 8) with the step-time
// model's defaults and compares each latency with the published one. The
// tolerance is stated in testdata/tp/README.md before the comparison: the
// planner's band claims the engine runs within x0.8-x1.2 of the roofline's
// speed, so predicted/measured must lie in [0.8, 1.2]. Cells outside it are
// listed below with the reason, never closed by fitting. Every cell must also
// come closer to the measurement with the all-reduce term than without it:
// tensor parallelism is not free.
func TestTensorParallelAgainstPublished(t *testing.T) {
	rows := readTPRows(t, filepath.Join("testdata", "tp", "vllm-16300-a100-qwq32b.csv"))
	gpu, err := hardware.LookupGPU("A100 80GB")
	if err != nil {
		t.Fatal(err)
	}
	// Known gaps: the measured latency falls far less with TP than the
	// weights each GPU streams (per token: 27.5, 19.6, 15.8 ms at TP 2, 4,
	// 8, which a + b/TP fits with a = 11.6 ms that does not shrink): vLLM
	// 0.7.2 ran its V0 engine, whose per-step work on the CPU (scheduling,
	// input preparation, broadcasting each step to the TP workers) is not
	// in this model's 100 us overhead, and each of the 129 all-reduces
	// costs more as TP grows (one-shot reads from TP-1 peers) where the
	// catalogue gives one latency. Neither is fitted here.
	known := map[string]string{
		"1/2":  "vLLM 0.7.2 (V0 engine): per-step CPU work and TP-growing all-reduce latency not modelled",
		"1/4":  "vLLM 0.7.2 (V0 engine): per-step CPU work and TP-growing all-reduce latency not modelled",
		"1/8":  "vLLM 0.7.2 (V0 engine): per-step CPU work and TP-growing all-reduce latency not modelled",
		"16/2": "vLLM 0.7.2 (V0 engine): per-step CPU work and TP-growing all-reduce latency not modelled",
		"16/4": "vLLM 0.7.2 (V0 engine): per-step CPU work and TP-growing all-reduce latency not modelled",
		"16/8": "vLLM 0.7.2 (V0 engine): per-step CPU work and TP-growing all-reduce latency not modelled",
	}
	var b strings.Builder
	fmt.Fprintf(&b, "QwQ-32B on %s (%s), 1 input + 200 output tokens: simulated vs vllm#16300\n", gpu.Name, gpu.Interconnect.Kind)
	fmt.Fprintf(&b, "%-5s %-3s %12s %12s %10s %7s  %s\n", "batch", "tp", "no all-red.", "simulated", "published", "ratio", "check")
	for _, r := range rows {
		d := hardware.Deployment{GPU: gpu, Model: qwq32b(), WeightsDType: hardware.BF16, KVCacheDType: hardware.BF16, TensorParallelSize: r.tp}
		m := newStepModel(d, 0, StepTime{})
		free := m
		free.allReduceSec, free.allReduceSecPerToken = 0, 0
		got, without := benchLatency(&m, r.batch), benchLatency(&free, r.batch)
		ratio := got / r.latency
		key := fmt.Sprintf("%d/%d", r.batch, r.tp)
		if math.Abs(got-r.latency) >= math.Abs(without-r.latency) {
			t.Errorf("batch %d TP %d: %.2f s with all-reduces, %.2f s without, published %.2f s: the all-reduce term does not bring it closer", r.batch, r.tp, got, without, r.latency)
		}
		in := ratio >= 0.8 && ratio <= 1.2
		reason, gap := known[key]
		check := "ok"
		switch {
		case in && gap:
			check = "ok (listed as a gap: remove it)"
			t.Errorf("batch %d TP %d: within tolerance but listed as a known gap", r.batch, r.tp)
		case gap:
			check = "KNOWN GAP: " + reason
		case !in:
			check = "FAIL"
			t.Errorf("batch %d TP %d: simulated %.2f s, published %.2f s (x%.2f)", r.batch, r.tp, got, r.latency, ratio)
		}
		fmt.Fprintf(&b, "%-5d %-3d %11.2fs %11.2fs %9.2fs %7.2f  %s\n", r.batch, r.tp, without, got, r.latency, ratio, check)
	}
	t.Log("\n" + b.String())
}

type tpRow struct {
	batch, tp int
	latency   float64
}

func readTPRows(t *testing.T, path string) []tpRow {
	t.Helper()
	recs := readCSV(t, path)
	var rows []tpRow
	for i, rec := range recs[1:] {
		b, err1 := strconv.Atoi(rec[0])
		tp, err2 := strconv.Atoi(rec[1])
		l, err3 := strconv.ParseFloat(rec[2], 64)
		if err1 != nil || err2 != nil || err3 != nil {
			t.Fatalf("%s:%d: bad row %q", path, i+2, rec)
		}
		rows = append(rows, tpRow{b, tp, l})
	}
	return rows
}

// benchLatency is benchmark_latency's figure for one batch of batch
// requests of 1 prompt token and 200 output tokens: the prefill step that
// gives the first token, then 199 decode steps, every request in each.
func benchLatency(m *stepModel, batch int) float64 {
	var total float64
	chunks := make([]chunk, batch)
	for step := range 200 {
		for i := range chunks {
			chunks[i] = chunk{start: step, n: 1}
		}
		total += float64(m.micros(chunks)) / 1e6
	}
	return total
}
