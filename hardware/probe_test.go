package hardware

import (
	"errors"
	"strings"
	"testing"
)

// On a machine without the NVIDIA driver (CI, this repository's dev boxes)
// Probe must fail cleanly with ErrNoDriver; with a driver it lists devices.
func TestProbe(t *testing.T) {
	gpus, err := Probe()
	if err != nil {
		if !errors.Is(err, ErrNoDriver) {
			t.Fatalf("Probe: %v, want an error wrapping ErrNoDriver", err)
		}
		if !strings.HasPrefix(err.Error(), "no NVIDIA driver found (") {
			t.Errorf("message %q", err)
		}
		return
	}
	if len(gpus) == 0 {
		t.Fatal("Probe succeeded with no devices")
	}
	for i, g := range gpus {
		if g.Index != i || g.Name == "" || g.MemoryTotalBytes == 0 {
			t.Errorf("device %d: %+v", i, g)
		}
	}
}

func TestDetectedGPUAsGPU(t *testing.T) {
	known := withCatalog(DetectedGPU{Name: "NVIDIA GeForce RTX 4090", MemoryTotalBytes: 24564 << 20})
	if known.Catalog == nil || known.AsGPU().Name != "RTX 4090" || known.AsGPU().MemoryBytes >= int64(known.MemoryTotalBytes) {
		t.Errorf("known device: %+v", known.AsGPU())
	}
	unknown := withCatalog(DetectedGPU{Name: "NVIDIA A10G", MemoryTotalBytes: 23028 << 20})
	if g := unknown.AsGPU(); unknown.Catalog != nil || g.Name != "NVIDIA A10G" || g.MemoryBytes != 23028<<20 {
		t.Errorf("unknown device: %+v", g)
	}
}
