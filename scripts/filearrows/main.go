// Command filearrows measures how the files of Go packages lean on each
// other, for issue 51's before -> after figures:
//
//	go run ./scripts/filearrows ./live ./live/upstream ...
//
// For each package (non-test files of the build for this GOOS/GOARCH) it
// prints its files and lines, its file-to-file arrows, how many of them
// run back up, the files that reach the most others, and the ten longest
// functions.
//
// The rule. File A has an arrow to file B (A != B, same package) when an
// identifier in A refers, by go/types' resolution (types.Info.Uses), to an
// object of the package declared in B: a package-level func, type, var or
// const, a method, or a struct field. Arrows are counted once per ordered
// pair of files.
//
// "Back up": the files are laid in one line, callers first and leaves
// last, by Eades, Lin and Smyth's greedy ordering for the feedback arc set
// (repeatedly: files with no arrows out go to the end, files with no arrows
// in go to the front, else the file with most arrows out less arrows in
// goes to the front; ties broken by name). An arrow from a file to one laid
// before it runs back up: it is what keeps the files from reading as layers.
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: filearrows ./pkg [./pkg ...]")
		os.Exit(2)
	}
	exports, err := exportMap(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, dir := range os.Args[1:] {
		if err := report(os.Stdout, dir, exports); err != nil {
			fmt.Fprintln(os.Stderr, dir+":", err)
			os.Exit(1)
		}
	}
}

// exportMap asks go list for the compiled export data of every dependency.
func exportMap(pkgs []string) (map[string]string, error) {
	args := append([]string{"list", "-export", "-deps", "-f", "{{.ImportPath}} {{.Export}}"}, pkgs...)
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %v", err)
	}
	m := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if path, file, ok := strings.Cut(sc.Text(), " "); ok && file != "" {
			m[path] = file
		}
	}
	return m, nil
}

func report(w io.Writer, dir string, exports map[string]string) error {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}\n{{range .GoFiles}}{{.}}\n{{end}}", dir).Output()
	if err != nil {
		return fmt.Errorf("go list: %v", err)
	}
	lines := strings.Fields(string(out))
	path, names := lines[0], lines[1:]
	fset := token.NewFileSet()
	var files []*ast.File
	total := 0
	for _, n := range names {
		src, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return err
		}
		total += bytes.Count(src, []byte("\n"))
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), src, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files = append(files, f)
	}
	imp := importer.ForCompiler(fset, "gc", func(p string) (io.ReadCloser, error) {
		if f, ok := exports[p]; ok {
			return os.Open(f)
		}
		return nil, fmt.Errorf("no export data for %s", p)
	})
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Selections: map[*ast.SelectorExpr]*types.Selection{}}
	conf := types.Config{Importer: imp}
	pkg, err := conf.Check(path, fset, files, info)
	if err != nil {
		return err
	}
	base := func(p token.Pos) string { return filepath.Base(fset.Position(p).Filename) }
	edges := map[string]map[string]bool{}
	// FILEARROWS_WHY=a.go,b.go lists the names behind the arrows into and
	// out of those files.
	why, whys := map[string]bool{}, map[string]bool{}
	for _, f := range strings.Split(os.Getenv("FILEARROWS_WHY"), ",") {
		why[f] = true
	}
	for _, n := range names {
		edges[n] = map[string]bool{}
	}
	for id, obj := range info.Uses {
		if obj == nil || obj.Pkg() != pkg || !obj.Pos().IsValid() {
			continue
		}
		if _, ok := obj.(*types.PkgName); ok {
			continue
		}
		if obj.Parent() != nil && obj.Parent() != pkg.Scope() {
			continue // a local: parameter, variable, label
		}
		from, to := base(id.Pos()), base(obj.Pos())
		if from != to {
			edges[from][to] = true
			if why[from] || why[to] {
				whys[from+" -> "+to+": "+obj.Name()] = true
			}
		}
	}
	arrows := 0
	for _, m := range edges {
		arrows += len(m)
	}
	order := eades(names, edges)
	pos := map[string]int{}
	for i, n := range order {
		pos[n] = i
	}
	back := 0
	var backs []string
	for a, m := range edges {
		for b := range m {
			if pos[b] < pos[a] {
				back++
				backs = append(backs, a+" -> "+b)
			}
		}
	}
	sort.Strings(backs)
	fmt.Fprintf(w, "%s: %d files, %d lines, %d arrows, %d back up\n", path, len(names), total, arrows, back)
	fmt.Fprintf(w, "  order: %s\n", strings.Join(order, " "))
	hubs := append([]string(nil), names...)
	sort.SliceStable(hubs, func(i, j int) bool { return len(edges[hubs[i]]) > len(edges[hubs[j]]) })
	fmt.Fprint(w, "  most arrows out:")
	for _, h := range hubs[:min(5, len(hubs))] {
		fmt.Fprintf(w, " %s %d", h, len(edges[h]))
	}
	fmt.Fprintln(w)
	if os.Getenv("FILEARROWS_BACK") != "" {
		for _, b := range backs {
			fmt.Fprintln(w, "  back:", b)
		}
	}
	var whyList []string
	for k := range whys {
		whyList = append(whyList, k)
	}
	sort.Strings(whyList)
	for _, k := range whyList {
		fmt.Fprintln(w, "  why:", k)
	}
	type fn struct {
		name  string
		lines int
	}
	var fns []fn
	for _, f := range files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			name := fd.Name.Name
			if fd.Recv != nil && len(fd.Recv.List) > 0 {
				t := fd.Recv.List[0].Type
				if s, ok := t.(*ast.StarExpr); ok {
					t = s.X
				}
				if ix, ok := t.(*ast.IndexExpr); ok {
					t = ix.X
				}
				if id, ok := t.(*ast.Ident); ok {
					name = id.Name + "." + name
				}
			}
			n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			fns = append(fns, fn{base(fd.Pos()) + ":" + name, n})
		}
	}
	sort.SliceStable(fns, func(i, j int) bool {
		if fns[i].lines != fns[j].lines {
			return fns[i].lines > fns[j].lines
		}
		return fns[i].name < fns[j].name
	})
	fmt.Fprint(w, "  longest functions:")
	for _, f := range fns[:min(10, len(fns))] {
		fmt.Fprintf(w, " %s %d,", f.name, f.lines)
	}
	fmt.Fprintln(w)
	return nil
}

// eades lays the files in one line, callers first, leaves last.
func eades(names []string, edges map[string]map[string]bool) []string {
	left := map[string]bool{}
	for _, n := range names {
		left[n] = true
	}
	sorted := func() []string {
		var s []string
		for n := range left {
			s = append(s, n)
		}
		sort.Strings(s)
		return s
	}
	deg := func(n string) (in, out int) {
		for b := range edges[n] {
			if left[b] {
				out++
			}
		}
		for a := range left {
			if edges[a][n] {
				in++
			}
		}
		return
	}
	var front, back []string
	for len(left) > 0 {
		moved := true
		for moved {
			moved = false
			for _, n := range sorted() {
				if in, out := deg(n); out == 0 {
					back = append([]string{n}, back...)
					delete(left, n)
					moved = true
				} else if in == 0 {
					front = append(front, n)
					delete(left, n)
					moved = true
				}
			}
		}
		if len(left) == 0 {
			break
		}
		best, bestD := "", 0
		for _, n := range sorted() {
			in, out := deg(n)
			if d := out - in; best == "" || d > bestD {
				best, bestD = n, d
			}
		}
		front = append(front, best)
		delete(left, best)
	}
	return append(front, back...)
}
