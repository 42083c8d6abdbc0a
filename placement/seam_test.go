package placement

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The routing seam, kept by tests: outside this package no code names a
// concrete policy (it asks the registry by name and the Router by
// interface), and no code spells a strategy's name (it reads the
// registry's constants or its lists).

// concretePolicies returns the exported types of placement that have a
// Pick method (the policies; not the Router, the seam itself), and their
// exported constructors.
func concretePolicies(t *testing.T) map[string]bool {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]bool{}
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv == nil || fd.Name.Name != "Pick" || len(fd.Recv.List) != 1 {
				continue
			}
			rt := fd.Recv.List[0].Type
			if st, ok := rt.(*ast.StarExpr); ok {
				rt = st.X
			}
			// The Router drives a policy (and so has Pick): it is the seam.
			if id, ok := rt.(*ast.Ident); ok && id.IsExported() && id.Name != "Router" {
				types[id.Name] = true
			}
		}
	}
	// Their constructors: NewX... for each type X.
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, _ := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv != nil {
				continue
			}
			for typ := range types {
				if strings.HasPrefix(fd.Name.Name, "New"+typ) {
					types[fd.Name.Name] = true
				}
			}
		}
	}
	return types
}

// seamViolations lists, for one Go file outside placement, every reference
// to a concrete policy of placement (imported under pkgName) and every
// string literal that is a strategy's name, as "file:line: message".
func seamViolations(fset *token.FileSet, filename string, src any, placementPath string, policies map[string]bool, names []string) ([]string, error) {
	f, out, report, err := parseForViolations(fset, filename, src)
	if err != nil {
		return nil, err
	}
	local := ""
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == placementPath {
			local = "placement"
			if imp.Name != nil {
				local = imp.Name.Name
			}
		}
	}
	skip := map[*ast.BasicLit]bool{}
	for _, imp := range f.Imports {
		skip[imp.Path] = true
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.Field:
			if n.Tag != nil {
				skip[n.Tag] = true
			}
		case *ast.SelectorExpr:
			if id, ok := n.X.(*ast.Ident); ok && local != "" && id.Name == local && policies[n.Sel.Name] {
				report(n.Pos(), local+"."+n.Sel.Name+" names a concrete policy: use placement.New with a registered name and the Router's interfaces")
			}
		case *ast.BasicLit:
			if n.Kind != token.STRING || skip[n] {
				break
			}
			if s, err := strconv.Unquote(n.Value); err == nil && slices.Contains(names, s) {
				report(n.Pos(), strconv.Quote(s)+" spells a strategy's name: use the registry's constant or lists")
			}
		}
		return true
	})
	return *out, nil
}

func TestSeamArchitecture(t *testing.T) {
	module := modulePath(t)
	policies := concretePolicies(t)
	for _, want := range []string{"Affinity", "Hash", "LeastLoaded", "NewAffinity", "NewAffinityTable"} {
		if !policies[want] {
			t.Fatalf("concrete policies %v lack %s: the check would miss it", policies, want)
		}
	}
	fset := token.NewFileSet()
	checked := 0
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "placement", "testdata", ".git", "node_modules":
				if path != ".." {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		bad, err := seamViolations(fset, path, nil, module+"/placement", policies, Strategies())
		if err != nil {
			return err
		}
		for _, b := range bad {
			t.Error(b)
		}
		checked++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("checked %d files outside placement, want the whole module", checked)
	}
}

// TestSeamCheckCatches makes sure the check above can fail.
func TestSeamCheckCatches(t *testing.T) {
	const src = `package live

import (
	"hash"
	p "example.com/warden/placement"
)

type cfg struct {
	Strategy string ` + "`yaml:\"affinity\"`" + `
}

var _ hash.Hash64

func f(x p.Policy) {
	if a, ok := x.(*p.Affinity); ok {
		_ = a
	}
	_ = p.NewAffinity(p.Config{})
	switch "least-loaded" {
	case "affinity+kv":
	}
	_ = p.StrategyHash
}
`
	policies := map[string]bool{"Affinity": true, "NewAffinity": true}
	bad, err := seamViolations(token.NewFileSet(), "bad.go", src, "example.com/warden/placement", policies, []string{"hash", "least-loaded", "affinity"})
	if err != nil {
		t.Fatal(err)
	}
	// The import "hash", a struct tag and a variant are allowed.
	checkViolations(t, bad, []string{"p.Affinity names a concrete policy", "p.NewAffinity names a concrete policy", `"least-loaded" spells a strategy's name`})
}
