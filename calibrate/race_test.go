//go:build race

package calibrate_test

// raceEnabled is true under the race detector, whose slowdown of the
// client, proxy and emulator inflates wall-clock latencies.
const raceEnabled = true
