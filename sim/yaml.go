package sim

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// DecodeYAML decodes a spec file strictly into v: unknown keys and values
// of the wrong type are errors that read "name:line: key: reason" (key a
// dotted path such as vllm.max_num_seqs or farms[1].replicas). emptyHint is
// the error for an empty document. It returns the line of every key and
// sequence item by path, for errors found later by checks of the values.
// Farm specs use it, and so do the planner's plan files.
func DecodeYAML(data []byte, name string, v any, emptyHint string) (map[string]int, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, fmt.Errorf("%s: %s", name, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	lines, byLine := map[string]int{}, map[int]string{}
	collectKeys(&root, "", lines, byLine)
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: %s", name, emptyHint)
		}
		return nil, yamlError(name, err, byLine)
	}
	return lines, nil
}

// collectKeys records the line of every mapping key and sequence item by
// path ("a.b", "a[2]").
func collectKeys(n *yaml.Node, prefix string, lines map[string]int, byLine map[int]string) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			collectKeys(c, prefix, lines, byLine)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := n.Content[i].Value
			if prefix != "" {
				key = prefix + "." + key
			}
			if _, dup := lines[key]; !dup {
				lines[key] = n.Content[i].Line
			}
			byLine[n.Content[i].Line] = key
			collectKeys(n.Content[i+1], key, lines, byLine)
		}
	case yaml.SequenceNode:
		if prefix == "" {
			return // a document that is a list: no spec
		}
		for i, c := range n.Content {
			key := fmt.Sprintf("%s[%d]", prefix, i)
			if _, dup := lines[key]; !dup {
				lines[key] = c.Line
			}
			if _, taken := byLine[c.Line]; !taken {
				byLine[c.Line] = key
			}
			collectKeys(c, key, lines, byLine)
		}
	}
}

var (
	reYAMLLine    = regexp.MustCompile(`^line (\d+): (.*)$`)
	reYAMLUnknown = regexp.MustCompile(`^field (\S+) not found in type \S+$`)
)

// yamlError rewrites yaml.v3's errors as "file:line: key: reason".
func yamlError(name string, err error, byLine map[int]string) error {
	var entries []string
	var te *yaml.TypeError
	if errors.As(err, &te) {
		entries = te.Errors
	} else {
		entries = []string{strings.TrimPrefix(err.Error(), "yaml: ")} // e.g. from Duration.UnmarshalYAML
	}
	msgs := make([]string, 0, len(entries))
	for _, e := range entries {
		m := reYAMLLine.FindStringSubmatch(e)
		if m == nil {
			msgs = append(msgs, name+": "+e)
			continue
		}
		line, _ := strconv.Atoi(m[1])
		reason := m[2]
		// A nested "line N: ..." from Duration.UnmarshalYAML.
		if mm := reYAMLLine.FindStringSubmatch(reason); mm != nil {
			reason = mm[2]
		}
		key := byLine[line]
		if u := reYAMLUnknown.FindStringSubmatch(reason); u != nil {
			if key == "" {
				key = u[1]
			}
			reason = "unknown key"
		}
		if key == "" {
			msgs = append(msgs, fmt.Sprintf("%s:%d: %s", name, line, reason))
			continue
		}
		msgs = append(msgs, fmt.Sprintf("%s:%d: %s: %s", name, line, key, reason))
	}
	return errors.New(strings.Join(msgs, "; "))
}
