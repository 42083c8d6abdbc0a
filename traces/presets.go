package traces

import (
	"embed"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// presetFiles holds the workload presets, one YAML file each, whose
// comments say where every figure comes from (WORKLOAD.md has the table).
//
//go:embed presets/*.yaml
var presetFiles embed.FS

// BenchPreset is the preset of the product's bench: DefaultWorkload.
const BenchPreset = "bench"

// PresetNames lists the presets, sorted.
func PresetNames() []string {
	entries, err := presetFiles.ReadDir("presets")
	if err != nil {
		panic("traces: presets: " + err.Error())
	}
	var names []string
	for _, e := range entries {
		if n, ok := strings.CutSuffix(e.Name(), ".yaml"); ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

// PresetSource returns the YAML file of preset name, comments included.
func PresetSource(name string) ([]byte, error) {
	if !IsPresetName(name) {
		return nil, fmt.Errorf("%q is not a preset name (a name without a slash or an extension)", name)
	}
	data, err := presetFiles.ReadFile(path.Join("presets", name+".yaml"))
	if err != nil {
		return nil, fmt.Errorf("no workload preset %q (the presets: %s)", name, strings.Join(PresetNames(), ", "))
	}
	return data, nil
}

// Preset returns the workload preset name.
func Preset(name string) (Workload, error) { return presetAt(name, 0) }

func presetAt(name string, depth int) (Workload, error) {
	data, err := PresetSource(name)
	if err != nil {
		return Workload{}, err
	}
	return parseWorkload(data, "preset "+name, depth)
}

// IsPresetName reports whether ref names a preset rather than a file: it
// has no slash and no extension. "bench" is the preset even where a
// directory bench/ exists; write ./bench to read a file of that name.
func IsPresetName(ref string) bool {
	return ref != "" && !strings.ContainsAny(ref, `/\`) && filepath.Ext(ref) == "" && ref != "." && ref != ".."
}

// LoadWorkloadRef reads the workload ref names: a preset (IsPresetName)
// or a YAML file.
func LoadWorkloadRef(ref string) (Workload, error) { return resolveRef(ref, "", 0) }

// resolveRef reads ref, a preset or a file (relative to dir when not
// absolute), at depth.
func resolveRef(ref, dir string, depth int) (Workload, error) {
	if IsPresetName(ref) {
		return presetAt(ref, depth)
	}
	p := ref
	if dir != "" && !filepath.IsAbs(p) {
		p = filepath.Join(dir, p)
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return Workload{}, err
	}
	return parseWorkload(data, p, depth)
}
