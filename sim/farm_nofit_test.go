package sim

import (
	"testing"

	"github.com/lm-warden/warden/hardware"
)

// A model that does not fit is a hardware.NoFitError that callers (the
// planner) can tell apart from a bad spec.
func TestResolveNoFitUnwraps(t *testing.T) {
	_, err := ParseFarm([]byte("model: meta-llama/Llama-3.1-70B-Instruct\ngpu: RTX A4000\nreplicas: 1\n"), "big.yaml")
	if err == nil {
		t.Fatal("70B on one A4000 resolved; want an error")
	}
	if !hardware.IsNoFit(err) {
		t.Fatalf("error %v does not unwrap to a hardware.NoFitError", err)
	}
}
