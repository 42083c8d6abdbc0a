//go:build race

package planner

// raceEnabled is true under the race detector.
const raceEnabled = true
