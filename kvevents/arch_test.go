package kvevents

import (
	"testing"

	"github.com/lm-warden/warden/internal/archtest"
)

// TestArchitecture: kvevents is a leaf, as placement is: vLLM's KV-cache
// event wire and ledgers, imported by live (the proxy), sim (replays) and
// the emulator (publisher), importing nothing of the project; it speaks
// ZeroMQ, never HTTP.
func TestArchitecture(t *testing.T) {
	archtest.Check(t, "kvevents", archtest.Rules{
		Never: []string{"live/...", "epp/...", "cmd/...", "web/...", "sim/...", "planner/...", "bench/...", "emulator/...", "calibrate/..."},
		Std:   map[string]string{"net/http": "kvevents speaks ZeroMQ; HTTP is the proxy's"},
	})
}
