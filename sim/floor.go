package sim

import "time"

// DecodeFloor is the least time one replica of f can take to decode one
// token: the step that reads the replica's weights once at the GPUs' full
// memory bandwidth (no efficiency derating, no KV reads, no step overhead),
// scaled by the farm's speed_scale. No real engine beats it without
// speculative decoding, which the simulator does not model; a journal whose
// turns ran much faster than it was recorded on a faster clock, such as
// `warden emulate --speed` (planner's compression check).
func (f *Farm) DecodeFloor() time.Duration {
	tp := float64(max(f.Spec.TensorParallelSize, 1))
	bw := f.Deployment.GPU.MemoryBandwidthBytesPerSec * tp
	if bw <= 0 {
		return 0
	}
	sec := float64(f.Sizing.WeightsBytes) * tp / bw
	if k := f.Spec.SpeedScale; k > 0 {
		sec /= k
	}
	return time.Duration(sec * float64(time.Second))
}
