package main

import (
	"runtime"
	"strings"
	"testing"
)

// TestVersion: `warden --version` (and -v) print what `warden version`
// prints: the version, the Go release and the platform.
func TestVersion(t *testing.T) {
	want, err := execWarden(t, "version")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(want, "warden "+version) || !strings.Contains(want, runtime.Version()) || !strings.HasSuffix(want, runtime.GOOS+"/"+runtime.GOARCH+"\n") {
		t.Errorf("warden version printed %q", want)
	}
	for _, args := range [][]string{{"--version"}, {"-v"}} {
		got, err := execWarden(t, args...)
		if err != nil || got != want {
			t.Errorf("warden %s printed %q (%v), want %q", args[0], got, err, want)
		}
	}
}
