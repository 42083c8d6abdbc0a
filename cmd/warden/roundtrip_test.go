package main

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestSynthReplayRoundTrip: synthetic sessions written to a trace file and
// replayed closed-loop give exactly the results of the in-memory synthetic
// run with the same seed (issue 4's round trip).
func TestSynthReplayRoundTrip(t *testing.T) {
	tests := []struct {
		name     string
		sessions string
		duration string
		seed     string
		farm     string
	}{
		{"a4000 4 sessions", "4", "1m", "7", ""},
		{"a4000 8 sessions", "8", "90s", "11", ""},
		{"5090 farm", "6", "1m", "3", "../../examples/rtx5090-gemma3-27b-int4.yaml"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "synth.jsonl")
			if _, err := runWarden(t, "trace", "synth", "--sessions", tc.sessions, "--duration", tc.duration, "--seed", tc.seed, path); err != nil {
				t.Fatal(err)
			}
			common := []string{"sim", "--json", "--sessions", tc.sessions, "--duration", tc.duration, "--seed", tc.seed,
				"--strategies", "hash,least-loaded,affinity"}
			if tc.farm != "" {
				common = append(common, "--farm", tc.farm)
			}
			mem, err := runWarden(t, common...)
			if err != nil {
				t.Fatal(err)
			}
			replay, err := runWarden(t, append(common, "--trace", path, "--closed-loop")...)
			if err != nil {
				t.Fatal(err)
			}
			var a, b struct {
				Rows []map[string]any `json:"rows"`
			}
			if err := json.Unmarshal([]byte(mem), &a); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(replay), &b); err != nil {
				t.Fatal(err)
			}
			if len(a.Rows) != 3 {
				t.Fatalf("in-memory run gave %d rows, want 3 (one per strategy)", len(a.Rows))
			}
			if d := cmp.Diff(a.Rows, b.Rows); d != "" {
				t.Errorf("replay of the synthetic trace differs from the in-memory run (-memory +replay):\n%s", d)
			}
		})
	}
}
