package racetest

import "testing"

// fakeTB records what SimulationOnly asks of its test.
type fakeTB struct {
	testing.TB
	name           string
	fatal, skipped bool
}

func (f *fakeTB) Helper()               {}
func (f *fakeTB) Name() string          { return f.name }
func (f *fakeTB) Fatalf(string, ...any) { f.fatal = true }
func (f *fakeTB) Skip(...any)           { f.skipped = true }

// TestSimulationOnly: a test the second run matches skips exactly under
// the race detector; one it does not match fails, so that no test skips
// for ever.
func TestSimulationOnly(t *testing.T) {
	for _, tt := range []struct {
		name      string
		wantFatal bool
	}{
		{"TestPlanBuiltInExample", false},
		{"TestSolveKnownAnswer", false},
		{"TestPlanSummaryWidth/built-in", false},
		{"TestRoutingCards", true},
		{"TestXPlan", true},
	} {
		f := &fakeTB{name: tt.name}
		SimulationOnly(f)
		if f.fatal != tt.wantFatal {
			t.Errorf("%s: failed %v, want %v", tt.name, f.fatal, tt.wantFatal)
		}
		if !tt.wantFatal && f.skipped != Enabled {
			t.Errorf("%s: skipped %v under the race detector %v", tt.name, f.skipped, Enabled)
		}
	}
}
