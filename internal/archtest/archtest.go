package archtest

// A package's place in the module's layers: which packages of the project
// it may import, and which it may never depend on, directly or not.

import (
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// Module is the module's path.
const Module = "github.com/lm-warden/warden"

// Rules are one package's place in the layers. Paths are relative to the
// module ("live", "live/upstream"); one ending in "/..." stands for the
// package and every package below it.
type Rules struct {
	// Imports are the project packages the package may import directly:
	// any other is an import the layers do not allow (nil: none, a leaf).
	Imports []string
	// Never are the project packages nothing the package depends on,
	// directly or not, may be: those above it in the layers.
	Never []string
	// Std are packages outside the project it may not import directly,
	// each with why.
	Std map[string]string
}

// matches reports whether the import path is pattern's package (or under
// it, for a pattern ending in "/...").
func matches(path, pattern string) bool {
	if sub, ok := strings.CutSuffix(pattern, "/..."); ok {
		p := Module + "/" + sub
		return path == p || strings.HasPrefix(path, p+"/")
	}
	return path == Module+"/"+pattern
}

func matchesAny(path string, patterns []string) bool {
	for _, p := range patterns {
		if matches(path, p) {
			return true
		}
	}
	return false
}

// list runs go list on pkg (module-relative) with the format: its
// non-test files, as built here.
func list(format, pkg string, deps bool) ([]string, error) {
	args := []string{"list", "-f", format}
	if deps {
		args = append(args, "-deps")
	}
	out, err := exec.Command("go", append(args, Module+"/"+pkg)...).Output()
	if err != nil {
		return nil, fmt.Errorf("go list %s: %v", pkg, err)
	}
	return strings.Fields(string(out)), nil
}

// Violations lists each import of pkg that r does not allow, and each
// dependency that r forbids.
func Violations(pkg string, r Rules) ([]string, error) {
	imports, err := list("{{join .Imports \"\\n\"}}", pkg, false)
	if err != nil {
		return nil, err
	}
	if len(imports) == 0 {
		return nil, fmt.Errorf("%s imports nothing: the check went wrong", pkg)
	}
	var out []string
	for _, imp := range imports {
		if why, bad := r.Std[imp]; bad {
			out = append(out, fmt.Sprintf("%s imports %s: %s", pkg, imp, why))
		}
		if (imp == Module || strings.HasPrefix(imp, Module+"/")) && !matchesAny(imp, r.Imports) {
			out = append(out, fmt.Sprintf("%s imports %s: not among the project packages it may import (%s)", pkg, imp, strings.Join(r.Imports, ", ")))
		}
	}
	deps, err := list("{{.ImportPath}}", pkg, true)
	if err != nil {
		return nil, err
	}
	for _, dep := range deps {
		if dep != Module+"/"+pkg && matchesAny(dep, r.Never) {
			out = append(out, fmt.Sprintf("%s depends on %s, which is above it in the layers", pkg, dep))
		}
	}
	return out, nil
}

// Check fails t for each of pkg's violations of r.
func Check(t *testing.T, pkg string, r Rules) {
	t.Helper()
	bad, err := Violations(pkg, r)
	if err != nil {
		t.Skip(err) // no go command: as sim's and live's own checks do
	}
	for _, b := range bad {
		t.Error(b)
	}
}

// TestSupport are the module's test-support packages: the helpers tests
// start (fakes, real servers run as children, a headless browser, these
// checks), which import package testing. Only tests, and other
// test-support packages, may import them: a non-test file that did would
// link test code into a production binary.
var TestSupport = []string{
	"internal/archtest", "internal/fakevllm", "internal/racetest", "internal/testproc",
	"live/internal/rawbackend", "live/redistest", "metrics/promtest", "web/webtest",
}

// importsOf maps each of the module's packages (module-relative, "." for
// the root) to the imports of its non-test files, as built here.
func importsOf() (map[string][]string, error) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", Module+"/...").Output()
	if err != nil {
		return nil, fmt.Errorf("go list %s/...: %v", Module, err)
	}
	pkgs := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		rel, ok := strings.CutPrefix(f[0], Module+"/")
		if !ok {
			rel = "."
		}
		pkgs[rel] = f[1:]
	}
	return pkgs, nil
}

// TestOnlyViolations lists each non-test import of one of support by a
// package outside support, and each package that imports "testing" in a
// non-test file without being listed in support (a test-support package
// the rule does not know of), or listed without existing.
func TestOnlyViolations(support []string) ([]string, error) {
	pkgs, err := importsOf()
	if err != nil {
		return nil, err
	}
	if len(pkgs) < 10 {
		return nil, fmt.Errorf("go list found %d packages: the check went wrong", len(pkgs))
	}
	var out []string
	for _, s := range support {
		if _, ok := pkgs[s]; !ok {
			out = append(out, fmt.Sprintf("test-support package %s does not exist", s))
		}
	}
	for _, pkg := range slices.Sorted(maps.Keys(pkgs)) {
		if matchesAny(Module+"/"+pkg, support) {
			continue
		}
		for _, imp := range pkgs[pkg] {
			if matchesAny(imp, support) {
				out = append(out, fmt.Sprintf("%s imports %s, a test-support package, in a non-test file", pkg, imp))
			}
			if imp == "testing" {
				out = append(out, fmt.Sprintf("%s imports testing in a non-test file: a test-support package not listed in archtest.TestSupport", pkg))
			}
		}
	}
	return out, nil
}
