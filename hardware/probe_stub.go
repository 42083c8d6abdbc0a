//go:build !(cgo && linux)

package hardware

import "fmt"

// Probe would list the local NVIDIA GPUs through NVML, which needs cgo on
// Linux; this build has neither, so it always returns an error wrapping
// ErrNoDriver.
func Probe() ([]DetectedGPU, error) {
	return nil, fmt.Errorf("%w (built without cgo: NVML unavailable)", ErrNoDriver)
}
