// Package strictyaml decodes YAML files strictly (unknown keys and values
// of the wrong type are errors) and reports every problem as
// "file:line: key: reason", key a dotted path such as
// models[0].replicas[1] or vllm.max_num_seqs. It is the one decoder of the
// farm specs and plans (sim, planner), the workload files (traces) and the
// proxy's configuration (live).
//
// Its one value type, [Duration] (duration.go), is the duration of all of
// them, with the rule for negative durations each kind of file has.
//
// yaml.v3 reports type errors and syntax errors as text only
// ("line 4: field x not found in type T"); this package is the one place
// that reads that text. UnmarshalYAML methods report a refused value with
// [Bad], which needs no parsing.
package strictyaml

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Doc is what Decode learnt of the file besides the value: the line of
// every key and sequence item, for errors found later by checks of the
// decoded values.
type Doc struct {
	// Name is the file's name as errors give it.
	Name  string
	empty bool
	lines map[string]int // path -> line of its first appearance
	order []string       // paths in file order
	// byLine lists the paths that start on each line, in file order; a
	// sequence item only where it is a scalar or no key shares its line.
	byLine map[int][]entry
}

type entry struct {
	path string
	key  bool // a mapping key (not a sequence item)
}

// Decode decodes data strictly into v. name is the file's name in errors.
// An empty document leaves v as it is; [Doc.Empty] reports it. A decoding
// error is an [*Error].
func Decode(name string, data []byte, v any) (*Doc, error) {
	d := &Doc{Name: name, lines: map[string]int{}, byLine: map[int][]entry{}}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return d, d.wrap(err)
	}
	d.collect(&root, "")
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			d.empty = true
			return d, nil
		}
		return d, d.wrap(err)
	}
	return d, nil
}

// Empty reports a file with no document (empty, or only comments).
func (d *Doc) Empty() bool { return d.empty }

// Line returns the line of path (the first, if the key repeats).
func (d *Doc) Line(path string) (int, bool) {
	l, ok := d.lines[path]
	return l, ok
}

// Nearest returns the line of path or, when path is not in the file (a
// default value), of its closest ancestor that is.
func (d *Doc) Nearest(path string) (int, bool) {
	for p := path; p != ""; {
		if l, ok := d.lines[p]; ok {
			return l, true
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return 0, false
}

// Paths returns every key and sequence item path in the file, in file
// order.
func (d *Doc) Paths() []string { return d.order }

// Errorf returns "file:line: path: reason" with the line of path, or of its
// nearest ancestor, or "file: path: reason" when neither is in the file.
func (d *Doc) Errorf(path, format string, args ...any) error {
	p := Problem{Path: path, Reason: fmt.Sprintf(format, args...)}
	p.Line, _ = d.Nearest(path)
	return &Error{File: d.Name, Problems: []Problem{p}}
}

func (d *Doc) add(path string, line int, key bool) {
	if _, dup := d.lines[path]; !dup {
		d.lines[path] = line
	}
	d.order = append(d.order, path)
	d.byLine[line] = append(d.byLine[line], entry{path, key})
}

// collect records the line of every mapping key and sequence item by path
// ("a.b", "a[2]").
func (d *Doc) collect(n *yaml.Node, prefix string) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			d.collect(c, prefix)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := n.Content[i].Value
			if prefix != "" {
				key = prefix + "." + key
			}
			d.add(key, n.Content[i].Line, true)
			d.collect(n.Content[i+1], key)
		}
	case yaml.SequenceNode:
		if prefix == "" {
			return // a document that is a list: no keys
		}
		for i, c := range n.Content {
			key := prefix + "[" + strconv.Itoa(i) + "]"
			d.add(key, c.Line, false)
			d.collect(c, key)
		}
	}
}

// pathAt names what starts on line: the one key there, the common parent
// of several (a flow mapping such as {a: 1, b: x}), or else the first
// sequence item.
func (d *Doc) pathAt(line int) string {
	var keys []string
	item := ""
	for _, e := range d.byLine[line] {
		if e.key {
			keys = append(keys, e.path)
		} else if item == "" {
			item = e.path
		}
	}
	switch len(keys) {
	case 0:
		return item
	case 1:
		return keys[0]
	}
	common := keys[0]
	for _, k := range keys[1:] {
		for !strings.HasPrefix(k, common+".") && !strings.HasPrefix(k, common+"[") && k != common {
			i := strings.LastIndexAny(common, ".[")
			if i < 0 {
				return ""
			}
			common = common[:i]
		}
	}
	return common
}

// keyAt names the key field on line: the path whose last element is field.
func (d *Doc) keyAt(line int, field string) string {
	for _, e := range d.byLine[line] {
		if e.key && (e.path == field || strings.HasSuffix(e.path, "."+field)) {
			return e.path
		}
	}
	return field
}

// Problem is one thing wrong in a file. Line is 0 when unknown, Path empty
// when no key is to blame (a syntax error).
type Problem struct {
	Line   int
	Path   string
	Reason string
}

// Error lists the problems of one file, one a line.
type Error struct {
	File     string
	Problems []Problem
}

func (e *Error) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.File)
		if p.Line > 0 {
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(p.Line))
		}
		b.WriteString(": ")
		if p.Path != "" {
			b.WriteString(p.Path)
			b.WriteString(": ")
		}
		b.WriteString(p.Reason)
	}
	return b.String()
}

// badValue is the error of [Bad].
type badValue struct {
	line   int
	reason string
}

func (e *badValue) Error() string { return fmt.Sprintf("line %d: %s", e.line, e.reason) }

// Bad is the error an UnmarshalYAML method returns for a value it refuses:
// Decode reports it at n's line and key.
func Bad(n *yaml.Node, format string, args ...any) error {
	return &badValue{line: n.Line, reason: fmt.Sprintf(format, args...)}
}

// wrap turns a yaml.v3 error into an *Error.
func (d *Doc) wrap(err error) error {
	var bv *badValue
	if errors.As(err, &bv) {
		return &Error{File: d.Name, Problems: []Problem{{Line: bv.line, Path: d.pathAt(bv.line), Reason: bv.reason}}}
	}
	var entries []string
	var te *yaml.TypeError
	if errors.As(err, &te) {
		entries = te.Errors
	} else {
		entries = []string{strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	e := &Error{File: d.Name}
	for _, s := range entries {
		line, reason, ok := cutLine(s)
		if !ok {
			e.Problems = append(e.Problems, Problem{Reason: s})
			continue
		}
		p := Problem{Line: line, Reason: reason, Path: d.pathAt(line)}
		if field, ok := unknownField(reason); ok {
			p.Path, p.Reason = d.keyAt(line, field), "unknown key"
		}
		e.Problems = append(e.Problems, p)
	}
	return e
}

// cutLine splits yaml.v3's "line N: reason".
func cutLine(s string) (int, string, bool) {
	rest, ok := strings.CutPrefix(s, "line ")
	if !ok {
		return 0, "", false
	}
	num, reason, ok := strings.Cut(rest, ": ")
	if !ok {
		return 0, "", false
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 1 {
		return 0, "", false
	}
	return n, reason, true
}

// unknownField reads yaml.v3's "field NAME not found in type T".
func unknownField(reason string) (string, bool) {
	rest, ok := strings.CutPrefix(reason, "field ")
	if !ok {
		return "", false
	}
	i := strings.LastIndex(rest, " not found in type ")
	if i <= 0 {
		return "", false
	}
	return rest[:i], true
}
