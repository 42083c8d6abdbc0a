package sim

import (
	"math"
	"testing"
	"time"

	"github.com/lm-warden/warden/hardware"
)

// toyDeployment has round figures so that the roofline can be worked by hand.
func toyDeployment(sliding bool) hardware.Deployment {
	m := hardware.Model{
		Name: "toy", NumLayers: 10, HiddenSize: 1000, NumAttentionHeads: 8, NumKVHeads: 2,
		HeadDim: 128, ParamCount: 1e9,
	}
	if sliding {
		m.SlidingWindowTokens, m.SlidingLayers = 512, 5
	}
	return hardware.Deployment{
		GPU:                hardware.GPU{Name: "toy", MemoryBytes: 80e9, MemoryBandwidthBytesPerSec: 1e12, BF16FLOPS: 100e12},
		Model:              m,
		WeightsDType:       hardware.BF16,
		KVCacheDType:       hardware.BF16,
		TensorParallelSize: 1,
	}
}

func TestStepTimeRoofline(t *testing.T) {
	st := StepTime{PrefillEfficiency: 0.5, BandwidthEfficiency: 0.8, StepOverhead: Duration(100 * time.Microsecond)}
	const (
		flopsPerSec = 100e12 * 0.5
		bytesPerSec = 1e12 * 0.8
		weights     = 2e9               // 1e9 params in bf16
		linear      = 2e9               // FLOPs per token: 2 x params
		attnPerPos  = 4 * 1024.0        // 4 x q_dim (8 heads x 128), per layer and attended position
		kvPerPos    = 2 * 2 * 128 * 2.0 // K and V x 2 kv heads x 128 x 2 bytes, per layer and position
		overhead    = 100e-6
	)
	tests := []struct {
		name    string
		sliding bool
		batch   []chunk
		want    float64 // seconds, worked by hand
	}{
		{
			name:  "one decode at context 1000 is memory bound",
			batch: []chunk{{start: 999, n: 1}},
			// bytes = weights + 10 layers x 1000 positions x 1024 B
			want: (weights+10*1000*kvPerPos)/bytesPerSec + overhead,
		},
		{
			name:  "a 2048-token prefill from scratch is compute bound",
			batch: []chunk{{start: 0, n: 2048}},
			// FLOPs = 2e9 x 2048 + 4096 x 10 layers x (1+2+...+2048)
			want: (linear*2048+attnPerPos*10*(2048*2049/2))/flopsPerSec + overhead,
		},
		{
			name:  "a chunk after 8192 cached tokens attends to them",
			batch: []chunk{{start: 8192, n: 1024}},
			want:  (linear*1024+attnPerPos*10*(1024*8192+1024*1025/2))/flopsPerSec + overhead,
		},
		{
			name:  "mixed batch: the sum of FLOPs against the sum of bytes",
			batch: []chunk{{start: 0, n: 1000}, {start: 4999, n: 1}, {start: 2999, n: 1}},
			want: math.Max(
				(linear*1002+attnPerPos*10*(1000*1001/2+5000+3000))/flopsPerSec,
				(weights+kvPerPos*10*(1000+5000+3000))/bytesPerSec) + overhead,
		},
		{
			name:    "sliding layers attend to at most the window",
			sliding: true,
			batch:   []chunk{{start: 0, n: 1024}},
			// 5 global layers: 1+...+1024; 5 sliding: 1+...+512 then 512 x 512.
			want: (linear*1024+attnPerPos*(5*(1024*1025/2)+5*(512*513/2+512*512)))/flopsPerSec + overhead,
		},
		{
			name:    "sliding layers read at most the window of KV",
			sliding: true,
			batch:   []chunk{{start: 9999, n: 1}},
			want:    (weights+kvPerPos*(5*10000+5*512))/bytesPerSec + overhead,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newStepModel(toyDeployment(tt.sliding), 0, st)
			got := m.seconds(tt.batch)
			if math.Abs(got-tt.want) > 1e-12*tt.want {
				t.Errorf("seconds = %.9g, want %.9g", got, tt.want)
			}
			if us := m.micros(tt.batch); us != int64(math.Ceil(tt.want*1e6)) {
				t.Errorf("micros = %d, want %d", us, int64(math.Ceil(tt.want*1e6)))
			}
		})
	}
}

// TestStepTimeA4000Anchors checks the defaults against the figures an
// operator of the reference farm expects: a decode step of a few sessions
// in the 22-40 ms range (8 GB of weights at 0.8 x 448 GB/s is 22 ms) and a
// cold 10k-token prompt in about 2-3 s of chunked prefill.
func TestStepTimeA4000Anchors(t *testing.T) {
	f := mustDefaultFarm(t)
	m := newStepModel(f.Deployment, float64(f.Sizing.WeightsBytes), f.Spec.StepTime)

	decode := []chunk{{start: 12000, n: 1}, {start: 9000, n: 1}, {start: 11000, n: 1}}
	if d := m.seconds(decode); d < 0.022 || d > 0.040 {
		t.Errorf("decode step of 3 sessions = %.1f ms, want 22-40 ms", d*1000)
	}
	// 10k tokens in 2048-token chunks: five steps, each attending to all
	// the tokens before it.
	var ttft float64
	for start := 0; start < 10000; start += 2048 {
		ttft += m.seconds([]chunk{{start: start, n: min(2048, 10000-start)}})
	}
	if ttft < 1.5 || ttft > 3.5 {
		t.Errorf("TTFT of a cold 10k-token prompt = %.2f s, want 1.5-3.5 s", ttft)
	}
	t.Logf("A4000 Qwen3-4B: decode step (3 sessions, ~11k context) %.1f ms; cold 10k prompt %.2f s",
		m.seconds(decode)*1000, ttft)
}
