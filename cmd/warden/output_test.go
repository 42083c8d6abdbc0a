package main

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
	if left, _ := filepath.Glob(filepath.Join(dir, ".*.tmp")); len(left) != 0 {
		t.Errorf("temporary files left behind: %v", left)
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

// TestOutPathCheckedFirst: an --out that cannot be written is refused
// before any simulation runs, naming the flag and the path, never a
// temporary file (issue 40: the plan ran whole, then failed on x.html.tmp).
func TestOutPathCheckedFirst(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		path, want string
	}{
		{filepath.Join(dir, "missing", "x.html"), "no such file or directory"},
		{dir, "is a directory"},
	} {
		o := &planOptions{Out: c.path, Duration: time.Hour, Sessions: []int{64}} // would take long, were it run
		err := runPlan(t.Context(), o, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--out") || !strings.Contains(err.Error(), c.path) ||
			!strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), ".tmp") {
			t.Errorf("--out %s: err = %v, want one naming the flag, the path and %q, no .tmp", c.path, err, c.want)
		}
	}
	if err := writeOutFile(filepath.Join(dir, "missing", "r.jsonl"), []byte("x")); err == nil || strings.Contains(err.Error(), ".tmp") {
		t.Errorf("writeOutFile into a missing directory: %v, want an error without .tmp", err)
	}
	ok := filepath.Join(dir, "ok.html")
	if err := writeOutFile(ok, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*.tmp")); len(left) != 0 {
		t.Errorf("temporary files left behind: %v", left)
	}
}

// TestInterruptedSaysSoOnce: Ctrl-C during a simulation of two strategies
// printed "warden: context canceled" and a second "context canceled" (the
// joined errors of both); it prints one line now.
func TestInterruptedSaysSoOnce(t *testing.T) {
	joined := errors.Join(context.Canceled, context.Canceled)
	var b strings.Builder
	if code := report(&b, joined, true); code != 130 || b.String() != "warden: interrupted\n" {
		t.Errorf("interrupted: exit %d, %q; want 130, one line", code, b.String())
	}
	b.Reset()
	if code := report(&b, errors.New("--out: bad"), false); code != 1 || b.String() != "warden: --out: bad\n" {
		t.Errorf("an error: exit %d, %q", code, b.String())
	}
}
