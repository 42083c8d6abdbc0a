package planner

import (
	"strings"
	"testing"

	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/traces"
)

// The two journals are real proxies': cmd/warden's tune journal (warden
// proxy in front of `warden emulate --speed 1`, see its tune_test.go) and
// testdata/tune/journal-speed10.jsonl, the same farm, workload and proxy
// config behind `warden emulate --speed 10`, loaded by `warden bench
// --workload ../cmd/warden/testdata/tune/workload.yaml --sessions 6 --step
// 60s --speed 10` (134 requests of 36 sessions in 5.8 s of wall time).
func TestJournalCompression(t *testing.T) {
	farm, err := sim.LoadFarm("../cmd/warden/testdata/tune/farm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		warn       bool
	}{
		{"speed 1", "../cmd/warden/testdata/tune/journal", false},
		{"speed 10", "testdata/tune/journal-speed10.jsonl", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files, err := JournalFiles([]string{tc.path})
			if err != nil {
				t.Fatal(err)
			}
			tr, _, err := LoadJournal(files, "")
			if err != nil {
				t.Fatal(err)
			}
			c := JournalCompression(tr, farm)
			note := compressionNote(c, farm)
			t.Logf("%+v: %s", c, note)
			if c.Turns < compressionMinTurns {
				t.Fatalf("%d turns measured, want at least %d", c.Turns, compressionMinTurns)
			}
			if got := note != ""; got != tc.warn {
				t.Errorf("warned %v (factor %.2f), want %v", got, c.Factor, tc.warn)
			}
			if tc.warn && !strings.Contains(note, "warden emulate --speed") {
				t.Errorf("note %q does not name the emulator's --speed", note)
			}
		})
	}
}

// TestJournalCompressionScales: a journal's turns compressed k times read
// as k times faster, and the check needs turns it can measure.
func TestJournalCompressionScales(t *testing.T) {
	farm, err := sim.LoadFarm("../cmd/warden/testdata/tune/farm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	floorMs := float64(farm.DecodeFloor().Microseconds()) / 1000
	// sessions of turns of 100 output tokens, each taking wallPerFloor
	// times the decode floor, 2 s of thinking between them.
	trace := func(sessions, turns, output int, wallPerFloor float64) *sim.Trace {
		tr := &sim.Trace{}
		for s := range sessions {
			at := int64(s * 10)
			for k := range turns {
				r := &traces.Request{Session: string(rune('a' + s)), Turn: k, ArrivalMs: at, PromptTokens: 16, OutputTokens: output}
				if k > 0 {
					r.ThinkMs = 2000
				}
				tr.Requests = append(tr.Requests, r)
				at += int64(wallPerFloor*floorMs*float64(output)) + 2000
			}
		}
		return tr
	}
	for _, tc := range []struct {
		name   string
		tr     *sim.Trace
		factor float64 // 0: nothing measured
		warn   bool
	}{
		{"real time", trace(4, 5, 100, 1.5), 1 / 1.5, false},
		{"faster than the floor, within spec decoding's reach", trace(4, 5, 100, 0.6), 1 / 0.6, false},
		{"ten times", trace(4, 5, 100, 0.1), 10, true},
		{"too few turns", trace(1, 5, 100, 0.1), 10, false},
		{"outputs too short to time", trace(4, 5, 8, 0.1), 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := JournalCompression(tc.tr, farm)
			if tc.factor == 0 {
				if c.Turns != 0 {
					t.Errorf("%+v: want nothing measured", c)
				}
			} else if c.Factor < tc.factor*0.9 || c.Factor > tc.factor*1.1 {
				t.Errorf("factor %.3f, want %.3f", c.Factor, tc.factor)
			}
			if got := compressionNote(c, farm) != ""; got != tc.warn {
				t.Errorf("%+v: warned %v, want %v", c, got, tc.warn)
			}
		})
	}
}
