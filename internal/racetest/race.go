//go:build race

package racetest

// Enabled is true when the binary runs under the race detector.
const Enabled = true
