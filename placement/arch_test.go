package placement

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The architecture says placement is pure: the simulator and the proxy run
// the very same decisions, so this package does no I/O, starts no
// goroutines, never reads a clock and never touches the global random
// source, and imports nothing of the project. These tests keep it so.

// forbiddenImports may not appear in placement's non-test files.
var forbiddenImports = map[string]string{
	"net":         "I/O",
	"net/http":    "I/O (the proxy's business)",
	"os":          "I/O",
	"os/exec":     "I/O",
	"io/fs":       "I/O",
	"io/ioutil":   "I/O",
	"syscall":     "I/O",
	"unsafe":      "not needed for pure code",
	"sync":        "policies are not safe for concurrent use; the proxy locks",
	"sync/atomic": "policies are not safe for concurrent use; the proxy locks",
	"crypto/rand": "an unseeded random source",
}

// forbiddenTimeFuncs read the clock or start timers.
var forbiddenTimeFuncs = map[string]bool{
	"Now": true, "Since": true, "Until": true, "Sleep": true, "After": true,
	"AfterFunc": true, "Tick": true, "NewTimer": true, "NewTicker": true,
}

// allowedRandNames are the parts of math/rand and math/rand/v2 that do not
// use the global source: constructors of explicit, seeded generators and
// their types.
var allowedRandNames = map[string]bool{
	"New": true, "NewSource": true, "NewZipf": true, "NewPCG": true, "NewChaCha8": true,
	"Rand": true, "Source": true, "Source64": true, "Zipf": true, "PCG": true, "ChaCha8": true,
}

// modulePath reads the module path from ../go.mod.
func modulePath(t *testing.T) string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	t.Fatal("../go.mod has no module line")
	return ""
}

// parseForViolations parses one Go source file for a check that lists
// what breaks its rules: the file, the list, and report, which adds
// "file:line: message" to it.
func parseForViolations(fset *token.FileSet, filename string, src any) (*ast.File, *[]string, func(token.Pos, string), error) {
	f, err := parser.ParseFile(fset, filename, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, nil, nil, err
	}
	out := new([]string)
	report := func(pos token.Pos, msg string) {
		*out = append(*out, fset.Position(pos).String()+": "+msg)
	}
	return f, out, report, nil
}

// purityViolations parses one Go source file and lists what breaks the
// rules, as "file:line: message".
func purityViolations(fset *token.FileSet, filename string, src any, module string) ([]string, error) {
	f, out, report, err := parseForViolations(fset, filename, src)
	if err != nil {
		return nil, err
	}
	// Local names of the imports we watch.
	timeNames, randNames := map[string]bool{}, map[string]bool{}
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		if why, bad := forbiddenImports[path]; bad {
			report(imp.Pos(), "imports "+path+": "+why)
		}
		if path == module || strings.HasPrefix(path, module+"/") {
			report(imp.Pos(), "imports "+path+": placement is a leaf and imports nothing of the project")
		}
		name := path[strings.LastIndex(path, "/")+1:]
		if path == "math/rand/v2" {
			name = "rand"
		}
		if imp.Name != nil {
			name = imp.Name.Name
		}
		switch path {
		case "time":
			timeNames[name] = true
		case "math/rand", "math/rand/v2":
			randNames[name] = true
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.GoStmt:
			report(n.Pos(), "starts a goroutine")
		case *ast.SelectorExpr:
			id, ok := n.X.(*ast.Ident)
			if !ok {
				break
			}
			if timeNames[id.Name] && forbiddenTimeFuncs[n.Sel.Name] {
				report(n.Pos(), id.Name+"."+n.Sel.Name+" reads the clock: take now as a parameter")
			}
			if randNames[id.Name] && !allowedRandNames[n.Sel.Name] {
				report(n.Pos(), id.Name+"."+n.Sel.Name+" uses the global random source: inject a *rand.Rand")
			}
		}
		return true
	})
	return *out, nil
}

func TestPackageIsPure(t *testing.T) {
	module := modulePath(t)
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		bad, err := purityViolations(fset, file, nil, module)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range bad {
			t.Error(b)
		}
		checked++
	}
	if checked < 5 {
		t.Fatalf("checked %d non-test files, want the whole package", checked)
	}
}

// TestPurityCheckCatches makes sure the check above can fail.
func TestPurityCheckCatches(t *testing.T) {
	const src = `package placement

import (
	"net/http"
	"os"
	clock "time"
	"math/rand"
	r2 "math/rand/v2"
	"example.com/warden/sim"
)

var _ = http.Get
var _ = os.Getenv

func f() {
	_ = clock.Now()
	_ = clock.Since(clock.Time{})
	_ = rand.Intn(3)
	_ = rand.New(rand.NewSource(1)) // allowed: an explicit source
	_ = r2.IntN(3)
	_ = clock.Duration(3)          // allowed: no clock read
	go f()
	_ = sim.X
}
`
	bad, err := purityViolations(token.NewFileSet(), "bad.go", src, "example.com/warden")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"imports net/http", "imports os", "imports example.com/warden/sim",
		"clock.Now reads the clock", "clock.Since reads the clock",
		"rand.Intn uses the global random source", "r2.IntN uses the global random source",
		"starts a goroutine",
	}
	checkViolations(t, bad, want)
}

// checkViolations fails unless bad holds exactly one violation mentioning
// each of want.
func checkViolations(t *testing.T, bad, want []string) {
	t.Helper()
	joined := strings.Join(bad, "\n")
	for _, w := range want {
		if !strings.Contains(joined, w) {
			t.Errorf("violations do not mention %q:\n%s", w, joined)
		}
	}
	if len(bad) != len(want) {
		t.Errorf("got %d violations, want %d:\n%s", len(bad), len(want), joined)
	}
}
