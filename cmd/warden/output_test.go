package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A failed rename (the target is a folder) leaves no temporary file.
func TestWriteOutFileCleansUp(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "out")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeOutFile(target, []byte("data")); err == nil {
		t.Fatal("writing over a non-empty folder: no error")
	}
	if _, err := os.Stat(target + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("temporary file left behind: %v", err)
	}
}

func TestDecodeResult(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`not json`, "not a JSON result"},
		{`{"kind":"other"}`, `kind "other"`},
		{`{"farm":"x","rows":[]}`, "no rows"},
		{`{"farm":"x","extra":1}`, "want a warden sim --json or warden bench --json report"},
		{`{"kind":"warden-plan","best":5}`, "plan result"},
	} {
		if _, _, err := decodeResult([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.in, err, tc.want)
		}
	}
	res, rep, err := decodeResult([]byte(`{"farm":"x","rows":[{"strategy":"affinity","sessions":4}]}`))
	if err != nil || res != nil || rep == nil || len(rep.Rows) != 1 {
		t.Errorf("sim report: %v %v %v", res, rep, err)
	}
}
