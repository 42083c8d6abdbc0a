package hardware

import "errors"

// ErrNoDriver is returned (wrapped) by Probe when no NVIDIA driver can be
// used: the NVML library is missing, the driver is not loaded, or the binary
// was built without cgo.
var ErrNoDriver = errors.New("no NVIDIA driver found")

// DetectedGPU is one device as NVML reports it.
type DetectedGPU struct {
	Index            int    `json:"index"`
	Name             string `json:"name"`               // NVML's name, e.g. "NVIDIA GeForce RTX 4090"
	MemoryTotalBytes uint64 `json:"memory_total_bytes"` // NVML total (nvidia-smi's figure, above the CUDA total)
	MemoryFreeBytes  uint64 `json:"memory_free_bytes"`
	// Catalog is the catalogue entry for this device, when there is one.
	Catalog *GPU `json:"catalog,omitempty"`
}

// AsGPU returns the GPU to size a deployment with: the catalogue entry when
// the device is known, else a GPU built from NVML's figures (memory only;
// bandwidth and FLOP/s unknown).
func (d DetectedGPU) AsGPU() GPU {
	if d.Catalog != nil {
		return *d.Catalog
	}
	return GPU{
		Name:        d.Name,
		Vendor:      "NVIDIA",
		MemoryBytes: int64(d.MemoryTotalBytes),
		Source:      "NVML (not in the catalogue: memory is NVML's total, a little above what CUDA sees)",
	}
}

// withCatalog fills Catalog from the device name.
func withCatalog(d DetectedGPU) DetectedGPU {
	if g, ok := MatchNVMLName(d.Name); ok {
		d.Catalog = &g
	}
	return d
}
