//go:build cgo && linux

package hardware

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Probe lists the local NVIDIA GPUs through NVML. Without a usable driver it
// returns an error wrapping ErrNoDriver.
//
// NVML is dlopen'ed by nvml.Init; when Init fails no other nvml function may
// be called (it would abort the process on a missing symbol), so none is.
func Probe() ([]DetectedGPU, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w (NVML: %s)", ErrNoDriver, ret.Error())
	}
	defer nvml.Shutdown()

	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML: counting devices: %s", ret.Error())
	}
	out := make([]DetectedGPU, 0, n)
	for i := range n {
		dev, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("NVML: device %d: %s", i, ret.Error())
		}
		name, ret := dev.GetName()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("NVML: device %d: name: %s", i, ret.Error())
		}
		mem, ret := dev.GetMemoryInfo()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("NVML: device %d (%s): memory info: %s", i, name, ret.Error())
		}
		out = append(out, withCatalog(DetectedGPU{
			Index: i, Name: name, MemoryTotalBytes: mem.Total, MemoryFreeBytes: mem.Free,
		}))
	}
	return out, nil
}
