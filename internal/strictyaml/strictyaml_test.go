package strictyaml

import (
	"errors"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

type level struct{ N int }

func (l *level) UnmarshalYAML(n *yaml.Node) error {
	if n.Value != "low" && n.Value != "high" {
		return Bad(n, "want low or high, got %q", n.Value)
	}
	l.N = len(n.Value)
	return nil
}

type spec struct {
	Name  string `yaml:"name"`
	Count int    `yaml:"count"`
	Level level  `yaml:"level"`
	Farms []struct {
		Model    string `yaml:"model"`
		Replicas []int  `yaml:"replicas"`
	} `yaml:"farms"`
	VLLM struct {
		MaxNumSeqs int `yaml:"max_num_seqs"`
		BlockSize  int `yaml:"block_size"`
	} `yaml:"vllm"`
}

func TestDecodeErrors(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown top key", "name: a\ncuont: 3\n", "f.yaml:2: cuont: unknown key"},
		{"unknown nested key", "vllm:\n  max_num_sequences: 8\n", "f.yaml:2: vllm.max_num_sequences: unknown key"},
		{"unknown key in an item", "farms:\n  - model: m\n    modle: x\n", "f.yaml:3: farms[0].modle: unknown key"},
		{"unknown key on an item's line", "farms:\n  - modle: x\n", "f.yaml:2: farms[0].modle: unknown key"},
		{"unknown key in a flow mapping", "vllm: {block_size: 16, max_seqs: 8}\n", "f.yaml:1: vllm.max_seqs: unknown key"},
		{"wrong type", "name: a\ncount: lots\n", "f.yaml:2: count: cannot unmarshal !!str `lots` into int"},
		{"wrong type in a flow mapping", "vllm: {block_size: 16, max_num_seqs: x}\n", "f.yaml:1: vllm: cannot unmarshal !!str `x` into int"},
		{"wrong type in a flow sequence", "farms:\n  - replicas: [1, x]\n", "f.yaml:2: farms[0].replicas: cannot unmarshal !!str `x` into int"},
		{"wrong type in a block sequence", "farms:\n  - replicas:\n      - 1\n      - x\n", "f.yaml:4: farms[0].replicas[1]: cannot unmarshal !!str `x` into int"},
		{"refused by UnmarshalYAML", "name: a\nlevel: medium\n", `f.yaml:2: level: want low or high, got "medium"`},
		{"two problems", "cuont: 1\ncount: x\n", "f.yaml:1: cuont: unknown key\nf.yaml:2: count: cannot unmarshal !!str `x` into int"},
		{"duplicate key", "name: a\nname: b\n", `f.yaml:2: name: mapping key "name" already defined at line 1`},
		{"syntax error", "name: [\n", "f.yaml:1: did not find expected node content"},
		{"syntax error without a line", "name: \x01\n", "f.yaml: control characters are not allowed"},
		{"not a mapping", "- 1\n", "f.yaml:1: cannot unmarshal !!seq into strictyaml.spec"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s spec
			_, err := Decode("f.yaml", []byte(tc.yaml), &s)
			if err == nil {
				t.Fatalf("decoded %+v, want error %q", s, tc.want)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Errorf("error %T, want *Error", err)
			}
			if err.Error() != tc.want {
				t.Errorf("error\n%s\nwant\n%s", err, tc.want)
			}
		})
	}
}

func TestDocLines(t *testing.T) {
	data := "# a comment\nname: a\nfarms:\n  - model: m\n    replicas: [1, 2]\n  - model: n\nvllm:\n  block_size: 16\n"
	var s spec
	d, err := Decode("f.yaml", []byte(data), &s)
	if err != nil {
		t.Fatal(err)
	}
	if d.Empty() || s.Name != "a" || len(s.Farms) != 2 || s.VLLM.BlockSize != 16 {
		t.Fatalf("decoded %+v (empty %v)", s, d.Empty())
	}
	for _, tc := range []struct {
		path          string
		line, nearest int
	}{
		{"name", 2, 2},
		{"farms[1]", 6, 6},
		{"farms[1].model", 6, 6},
		{"farms[0].replicas", 5, 5},
		{"farms[1].replicas", 0, 6},
		{"vllm.max_num_seqs", 0, 7},
		{"count", 0, 0},
	} {
		l, ok := d.Line(tc.path)
		if l != tc.line || ok != (tc.line > 0) {
			t.Errorf("Line(%s) = %d, %v; want %d", tc.path, l, ok, tc.line)
		}
		n, ok := d.Nearest(tc.path)
		if n != tc.nearest || ok != (tc.nearest > 0) {
			t.Errorf("Nearest(%s) = %d, %v; want %d", tc.path, n, ok, tc.nearest)
		}
	}
	want := "name farms farms[0] farms[0].model farms[0].replicas farms[0].replicas[0] farms[0].replicas[1] farms[1] farms[1].model vllm vllm.block_size"
	if got := strings.Join(d.Paths(), " "); got != want {
		t.Errorf("Paths() = %s\nwant %s", got, want)
	}
	if got := d.Errorf("farms[1].replicas", "want %d", 1).Error(); got != "f.yaml:6: farms[1].replicas: want 1" {
		t.Errorf("Errorf = %q", got)
	}
	if got := d.Errorf("count", "must be >= 1").Error(); got != "f.yaml: count: must be >= 1" {
		t.Errorf("Errorf of a key not in the file = %q", got)
	}
}

func TestDecodeEmpty(t *testing.T) {
	for _, data := range []string{"", "# only a comment\n", "\n\n"} {
		s := spec{Count: 7}
		d, err := Decode("f.yaml", []byte(data), &s)
		if err != nil || !d.Empty() || s.Count != 7 {
			t.Errorf("Decode(%q) = empty %v, err %v, count %d; want empty, no error, value kept", data, d.Empty(), err, s.Count)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add("name: a\ncount: 3\nfarms:\n  - model: m\n    replicas: [1, 2]\n")
	f.Add("vllm: {block_size: 16, max_seqs: x}\nlevel: medium\n")
	f.Add("name: [\n")
	f.Fuzz(func(t *testing.T, data string) {
		var s spec
		_, err := Decode("fuzz.yaml", []byte(data), &s)
		if err == nil {
			return
		}
		for _, line := range strings.Split(err.Error(), "\n") {
			if !strings.HasPrefix(line, "fuzz.yaml:") {
				t.Fatalf("error line %q does not name the file", line)
			}
		}
	})
}
