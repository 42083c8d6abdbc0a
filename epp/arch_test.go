package epp

import (
	"testing"

	"github.com/lm-warden/warden/internal/archtest"
)

// TestArchitecture: the picker is a front end of live and nothing else of
// the project: it reaches placement only through live's decision port
// (live.Decider), and nothing it depends on is a command, a report or the
// simulator.
func TestArchitecture(t *testing.T) {
	archtest.Check(t, "epp", archtest.Rules{
		Imports: []string{"live"},
		Never:   []string{"cmd/...", "web/...", "sim/...", "planner/...", "bench/...", "emulator/...", "calibrate/..."},
	})
}
