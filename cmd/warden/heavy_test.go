package main

import (
	"regexp"
	"testing"
)

// heavyRun matches the tests that make test runs a second time without
// the race detector (the Makefile's -run '^(TestPlan|TestSolve)'): a test
// that skips itself under the detector must be among them, or it would
// never run.
var heavyRun = regexp.MustCompile(`^(TestPlan|TestSolve)`)

// simulationOnly skips t under the race detector. t solves whole plans:
// simulation, which the detector slows about 13 times (the plan tests
// here: 31 s without, 326 s with); make test runs t again without it.
// The solver's concurrency stays under the detector in planner's
// TestSolveDeterministicInParallel.
func simulationOnly(t *testing.T) {
	t.Helper()
	if !heavyRun.MatchString(t.Name()) {
		t.Fatalf("%s skips under -race but make test's run without it (%s) does not match it: rename it", t.Name(), heavyRun)
	}
	if raceEnabled {
		t.Skip("pure simulation, slow under -race: make test runs it without the race detector")
	}
}
