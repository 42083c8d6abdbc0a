// Package racetest is what tests need to know of the race detector:
// whether it is on ([Enabled]: race.go under the race build tag,
// norace.go without), and [SimulationOnly], which skips a test that
// solves whole plans while it is, for make test runs such tests a second
// time without it.
package racetest

import (
	"regexp"
	"testing"
)

// SecondRun matches the tests that make test runs a second time without
// the race detector (the Makefile's -run '^(TestPlan|TestSolve)' over
// planner and cmd/warden): a test that skips itself under the detector
// must be among them, or it would never run.
var SecondRun = regexp.MustCompile(`^(TestPlan|TestSolve)`)

// SimulationOnly skips t under the race detector. t solves whole plans:
// simulation, which the detector slows about 13 times (planner's Solve
// tests 23 s without, 270 s with; cmd/warden's plan tests 31 s and 326 s);
// make test runs t again without it. The solver's concurrency stays under
// the detector in planner's TestSolveDeterministicInParallel,
// TestSolveCancel and TestSolveProgress. A test whose name SecondRun does
// not match fails, rather than skip for ever.
func SimulationOnly(t testing.TB) {
	t.Helper()
	if !SecondRun.MatchString(t.Name()) {
		t.Fatalf("%s skips under -race but make test's run without it (%s) does not match it: rename it", t.Name(), SecondRun)
	}
	if Enabled {
		t.Skip("pure simulation, slow under -race: make test runs it without the race detector")
	}
}
