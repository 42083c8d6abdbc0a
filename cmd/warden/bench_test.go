package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBenchBadFlags(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, `required flag(s) "target" not set`},
		{[]string{"--target", closed, "--sessions", "4,x"}, `invalid argument "4,x" for "--sessions"`},
		{[]string{"--target", closed, "--sessions", "0"}, "--sessions 0: want 1 to 4096"},
		{[]string{"--target", closed, "--sessions", "8,-1"}, "--sessions -1"},
		{[]string{"--target", closed, "--step", "0s"}, "--step 0s"},
		{[]string{"--target", closed, "--api", "grpc"}, "--api"},
		{[]string{"--target", closed, "--workload", "missing.yaml"}, "missing.yaml"},
		{[]string{"--target", "localhost:8000"}, "want an http:// or https:// URL"},
		{[]string{"--target", closed, "--sessions", "1", "--step", "1s"}, "unreachable"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			root := newRootCmd()
			var out, errb bytes.Buffer
			root.SetOut(&out)
			root.SetErr(&errb)
			root.SetArgs(append([]string{"bench"}, tc.args...))
			err := root.Execute()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestBenchRequestsFileKeptWhenNothingRan: a run that writes no record (the
// target unreachable) leaves an existing --requests file as it was and no
// temporary file beside it.
func TestBenchRequestsFileKeptWhenNothingRan(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	path := filepath.Join(dir, "requests.jsonl")
	if err := os.WriteFile(path, []byte("earlier run\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := newRootCmd()
	root.SetOut(&bytes.Buffer{})
	root.SetErr(&bytes.Buffer{})
	root.SetArgs([]string{"bench", "--target", closed, "--sessions", "1", "--step", "1s", "--requests", path})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("err = %v, want the target unreachable", err)
	}
	if got, _ := os.ReadFile(path); string(got) != "earlier run\n" {
		t.Errorf("--requests file now %q, want the earlier run's line", got)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("%d files in the folder, want only the --requests file", len(ents))
	}
}
