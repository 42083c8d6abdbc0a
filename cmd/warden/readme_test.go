package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestREADMECommands runs every `warden ...` command of the README's shell
// blocks in-process, in a temporary directory, so the README never lies. A
// command that another test runs instead (a server, say) ends with a comment
// `# run by TestName`, and that test must exist in this package's sources.
func TestREADMECommands(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	cmds := readmeCommands(t, readme)
	if len(cmds) < 2 {
		t.Fatalf("README has %d warden commands; want the main job and more", len(cmds))
	}
	sources := testSources(t)
	dir := t.TempDir()
	// The commands run in a scratch directory that links to the repository's
	// files (examples/, live/testdata/, ...), so outputs land in the scratch
	// directory and inputs resolve as they do from the repository root.
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.Symlink(filepath.Join(root, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range cmds {
		t.Run(c.line, func(t *testing.T) {
			if c.runBy != "" {
				if !regexp.MustCompile(`func ` + regexp.QuoteMeta(c.runBy) + `\(`).Match(sources) {
					t.Fatalf("README line %d says it is run by %s, which does not exist", c.lineNo, c.runBy)
				}
				return
			}
			t.Chdir(dir)
			var out, errb bytes.Buffer
			args, redirect := c.args, ""
			if n := len(args); n >= 2 && args[n-2] == ">" {
				args, redirect = args[:n-2], args[n-1]
			}
			root := newRootCmd()
			root.SetArgs(args)
			root.SetOut(&out)
			root.SetErr(&errb)
			if err := root.ExecuteContext(context.Background()); err != nil {
				t.Fatalf("README line %d: %s: %v\nstderr: %s", c.lineNo, c.line, err, errb.String())
			}
			if redirect != "" {
				if err := os.WriteFile(redirect, out.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

type readmeCmd struct {
	line   string
	lineNo int
	args   []string
	runBy  string
}

var runByRE = regexp.MustCompile(`#\s*run by (Test\w+)\s*$`)

// readmeCommands returns the warden commands inside ```sh / ```bash blocks.
// "go run ./cmd/warden" counts as "warden".
func readmeCommands(t *testing.T, readme []byte) []readmeCmd {
	t.Helper()
	var cmds []readmeCmd
	in := false
	sc := bufio.NewScanner(bytes.NewReader(readme))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "```sh") || strings.HasPrefix(line, "```bash"):
			in = true
			continue
		case strings.HasPrefix(line, "```"):
			in = false
			continue
		}
		if !in {
			continue
		}
		runBy := ""
		if m := runByRE.FindStringSubmatch(line); m != nil {
			runBy = m[1]
		}
		cmdline := line
		if i := strings.Index(cmdline, " #"); i >= 0 {
			cmdline = strings.TrimSpace(cmdline[:i])
		}
		if rest, ok := strings.CutPrefix(cmdline, "go run ./cmd/warden"); ok {
			cmdline = rest
		} else if rest, ok := strings.CutPrefix(cmdline, "warden "); ok {
			cmdline = rest
		} else {
			continue // not a warden command (make test, git clone, ...)
		}
		args, err := splitArgs(cmdline)
		if err != nil {
			t.Fatalf("README line %d: %v", n, err)
		}
		cmds = append(cmds, readmeCmd{line: line, lineNo: n, args: args, runBy: runBy})
	}
	return cmds
}

// splitArgs splits a command line the way a POSIX shell would for the simple
// cases the README uses: blanks, single and double quotes. A final "> FILE"
// stays as two arguments for the caller to apply.
func splitArgs(s string) ([]string, error) {
	var args []string
	var cur strings.Builder
	inArg := false
	var quote rune
	for _, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inArg = r, true
		case r == ' ' || r == '\t':
			if inArg {
				args = append(args, cur.String())
				cur.Reset()
				inArg = false
			}
		default:
			cur.WriteRune(r)
			inArg = true
		}
	}
	if quote != 0 {
		return nil, &os.PathError{Op: "split", Path: s, Err: os.ErrInvalid}
	}
	if inArg {
		args = append(args, cur.String())
	}
	return args, nil
}

func testSources(t *testing.T) []byte {
	t.Helper()
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	var all []byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	return all
}
