package hardware

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/agnivade/levenshtein"
	"go.yaml.in/yaml/v3"
)

//go:embed catalog/gpus.yaml catalog/models.yaml
var catalogFS embed.FS

// gpuEntry is one GPU as written in catalog/gpus.yaml (units in the names).
type gpuEntry struct {
	Name                  string   `yaml:"name"`
	Aliases               []string `yaml:"aliases"`
	NVMLNames             []string `yaml:"nvml_names"`
	Vendor                string   `yaml:"vendor"`
	MarketingMemoryGB     float64  `yaml:"marketing_memory_gb"`
	CUDATotalMemoryGiB    float64  `yaml:"cuda_total_memory_gib"`
	MemoryNote            string   `yaml:"memory_note"`
	MemoryBandwidthGBPerS float64  `yaml:"memory_bandwidth_gb_per_s"`
	BF16DenseTFLOPS       float64  `yaml:"bf16_dense_tflops"`
	FP8DenseTFLOPS        float64  `yaml:"fp8_dense_tflops"`
	Source                string   `yaml:"source"`
	ECC                   string   `yaml:"ecc"`
	ECCSource             string   `yaml:"ecc_source"`
	Interconnect          string   `yaml:"interconnect"`
	InterconnectGBPerS    float64  `yaml:"interconnect_gb_per_s"`
	PeerToPeer            *bool    `yaml:"peer_to_peer"`
	AllReduceLatencyUs    float64  `yaml:"all_reduce_latency_us"`
	InterconnectSource    string   `yaml:"interconnect_source"`
}

// modelEntry is one model as written in catalog/models.yaml.
type modelEntry struct {
	Name                string   `yaml:"name"`
	Aliases             []string `yaml:"aliases"`
	NumLayers           int      `yaml:"num_layers"`
	HiddenSize          int      `yaml:"hidden_size"`
	IntermediateSize    int      `yaml:"intermediate_size"`
	NumAttentionHeads   int      `yaml:"num_attention_heads"`
	NumKVHeads          int      `yaml:"num_kv_heads"`
	HeadDim             int      `yaml:"head_dim"`
	VocabSize           int      `yaml:"vocab_size"`
	TieWordEmbeddings   bool     `yaml:"tie_word_embeddings"`
	ParamCount          int64    `yaml:"param_count"`
	SlidingWindowTokens int      `yaml:"sliding_window_tokens"`
	SlidingLayers       int      `yaml:"sliding_layers"`
	MaxPositionTokens   int      `yaml:"max_position_tokens"`
	Source              string   `yaml:"source"`
}

// catalog is the parsed, indexed embedded catalogue.
type catalog struct {
	gpus     []GPU          // sorted by name
	models   []Model        // sorted by name
	gpuKey   map[string]int // normalized name or alias -> index in gpus
	modelKey map[string]int // normalized name or alias -> index in models
	nvmlKey  map[string]int // normalized NVML device name -> index in gpus
}

var (
	catalogOnce sync.Once
	theCatalog  *catalog
)

// loadedCatalog parses the embedded files once. The files are part of the
// binary and covered by tests, so a parse error is a programming error.
func loadedCatalog() *catalog {
	catalogOnce.Do(func() {
		c, err := parseCatalog(mustRead("catalog/gpus.yaml"), mustRead("catalog/models.yaml"))
		if err != nil {
			panic("hardware: embedded catalogue: " + err.Error())
		}
		theCatalog = c
	})
	return theCatalog
}

func mustRead(name string) []byte {
	b, err := catalogFS.ReadFile(name)
	if err != nil {
		panic("hardware: " + err.Error())
	}
	return b
}

// decodeStrict decodes YAML rejecting unknown fields; errors carry the line.
func decodeStrict(file string, data []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	return nil
}

// parseCatalog builds the catalogue from the two YAML documents and checks
// that every entry is complete and every name or alias is unambiguous.
func parseCatalog(gpuYAML, modelYAML []byte) (*catalog, error) {
	var ge []gpuEntry
	if err := decodeStrict("catalog/gpus.yaml", gpuYAML, &ge); err != nil {
		return nil, err
	}
	var me []modelEntry
	if err := decodeStrict("catalog/models.yaml", modelYAML, &me); err != nil {
		return nil, err
	}
	c := &catalog{gpuKey: map[string]int{}, modelKey: map[string]int{}, nvmlKey: map[string]int{}}
	for i, e := range ge {
		g, err := e.toGPU()
		if err != nil {
			return nil, fmt.Errorf("catalog/gpus.yaml: entry %d (%q): %w", i+1, e.Name, err)
		}
		c.gpus = append(c.gpus, g)
	}
	for i, e := range me {
		m, err := e.toModel()
		if err != nil {
			return nil, fmt.Errorf("catalog/models.yaml: entry %d (%q): %w", i+1, e.Name, err)
		}
		c.models = append(c.models, m)
	}
	slices.SortFunc(c.gpus, func(a, b GPU) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(c.models, func(a, b Model) int { return strings.Compare(a.Name, b.Name) })
	for i, g := range c.gpus {
		if err := addKeys(c.gpuKey, i, "catalog/gpus.yaml", g.Name, g.Aliases); err != nil {
			return nil, err
		}
		for _, n := range g.NVMLNames {
			if err := addKeys(c.nvmlKey, i, "catalog/gpus.yaml nvml_names", n, nil); err != nil {
				return nil, err
			}
		}
	}
	for i, m := range c.models {
		aliases := m.Aliases
		if _, short, ok := strings.Cut(m.Name, "/"); ok {
			aliases = append(slices.Clone(aliases), short) // "Qwen3-8B" finds "Qwen/Qwen3-8B"
		}
		if err := addKeys(c.modelKey, i, "catalog/models.yaml", m.Name, aliases); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func addKeys(idx map[string]int, i int, file, name string, aliases []string) error {
	for _, n := range append([]string{name}, aliases...) {
		k := normalize(n)
		if k == "" {
			return fmt.Errorf("%s: %q: empty name or alias", file, name)
		}
		if j, dup := idx[k]; dup && j != i {
			return fmt.Errorf("%s: name or alias %q of entry %q is already used by another entry", file, n, name)
		}
		idx[k] = i
	}
	return nil
}

func (e gpuEntry) toGPU() (GPU, error) {
	switch {
	case e.Name == "":
		return GPU{}, errors.New("name: missing")
	case !positive(e.CUDATotalMemoryGiB):
		return GPU{}, errors.New("cuda_total_memory_gib: want a positive number")
	case e.CUDATotalMemoryGiB*GiB >= math.MaxInt64:
		return GPU{}, fmt.Errorf("cuda_total_memory_gib: %g does not fit in int64 bytes", e.CUDATotalMemoryGiB)
	case !positive(e.MemoryBandwidthGBPerS):
		return GPU{}, errors.New("memory_bandwidth_gb_per_s: want a positive number")
	case !positive(e.BF16DenseTFLOPS):
		return GPU{}, errors.New("bf16_dense_tflops: want a positive number")
	case e.FP8DenseTFLOPS != 0 && !positive(e.FP8DenseTFLOPS):
		return GPU{}, errors.New("fp8_dense_tflops: want 0 (none) or a positive number")
	case e.Source == "":
		return GPU{}, errors.New("source: missing (name the datasheet)")
	case !slices.Contains([]string{ECCOn, ECCOff, ECCNone, ECCHBM}, e.ECC):
		return GPU{}, fmt.Errorf("ecc: want on, off, none or hbm, got %q", e.ECC)
	case e.ECCSource == "":
		return GPU{}, errors.New("ecc_source: missing (say where the ECC mode comes from)")
	case e.Interconnect == "":
		return GPU{}, errors.New("interconnect: missing (what joins a tensor-parallel group: \"PCIe 4.0 x16\", \"NVLink 4 (NVSwitch)\")")
	case !positive(e.InterconnectGBPerS):
		return GPU{}, errors.New("interconnect_gb_per_s: want a positive number (one GPU's bandwidth each way)")
	case e.PeerToPeer == nil:
		return GPU{}, errors.New("peer_to_peer: missing (true, or false where the driver stages transfers through host memory)")
	case !positive(e.AllReduceLatencyUs):
		return GPU{}, errors.New("all_reduce_latency_us: want a positive number")
	case e.InterconnectSource == "":
		return GPU{}, errors.New("interconnect_source: missing (name the datasheet and the measurement)")
	}
	return GPU{
		Name:                       e.Name,
		Aliases:                    e.Aliases,
		Vendor:                     e.Vendor,
		MemoryBytes:                int64(math.Round(e.CUDATotalMemoryGiB * GiB)),
		MemoryBandwidthBytesPerSec: e.MemoryBandwidthGBPerS * 1e9,
		BF16FLOPS:                  e.BF16DenseTFLOPS * 1e12,
		FP8FLOPS:                   e.FP8DenseTFLOPS * 1e12,
		Source:                     e.Source,
		MarketingMemoryGB:          e.MarketingMemoryGB,
		MemoryNote:                 e.MemoryNote,
		NVMLNames:                  e.NVMLNames,
		ECC:                        e.ECC,
		ECCSource:                  e.ECCSource,
		Interconnect: Interconnect{
			Kind:                e.Interconnect,
			BytesPerSec:         e.InterconnectGBPerS * 1e9,
			PeerToPeer:          *e.PeerToPeer,
			AllReduceLatencySec: e.AllReduceLatencyUs * 1e-6,
			Source:              e.InterconnectSource,
		},
	}, nil
}

// positive reports whether x is a finite number > 0 (YAML can spell .nan
// and .inf, which no comparison with 0 rejects on its own).
func positive(x float64) bool { return x > 0 && !math.IsInf(x, 1) }

func (e modelEntry) toModel() (Model, error) {
	m := Model{
		Name:                e.Name,
		Aliases:             e.Aliases,
		NumLayers:           e.NumLayers,
		HiddenSize:          e.HiddenSize,
		NumAttentionHeads:   e.NumAttentionHeads,
		NumKVHeads:          e.NumKVHeads,
		HeadDim:             e.HeadDim,
		ParamCount:          e.ParamCount,
		SlidingWindowTokens: e.SlidingWindowTokens,
		SlidingLayers:       e.SlidingLayers,
		MaxPositionTokens:   e.MaxPositionTokens,
		Source:              e.Source,
		IntermediateSize:    e.IntermediateSize,
		VocabSize:           e.VocabSize,
		TieWordEmbeddings:   e.TieWordEmbeddings,
	}
	if m.Source == "" {
		return Model{}, errors.New("source: missing")
	}
	return m, m.Validate()
}

// Validate reports the first field of m that cannot describe a real model.
func (m Model) Validate() error {
	switch {
	case m.Name == "":
		return errors.New("name: missing")
	case m.NumLayers <= 0:
		return fmt.Errorf("num_layers: want > 0, got %d", m.NumLayers)
	case m.HiddenSize <= 0:
		return fmt.Errorf("hidden_size: want > 0, got %d", m.HiddenSize)
	case m.NumAttentionHeads <= 0:
		return fmt.Errorf("num_attention_heads: want > 0, got %d", m.NumAttentionHeads)
	case m.NumKVHeads <= 0 || m.NumKVHeads > m.NumAttentionHeads:
		return fmt.Errorf("num_kv_heads: want 1..num_attention_heads (%d), got %d", m.NumAttentionHeads, m.NumKVHeads)
	case m.NumAttentionHeads%m.NumKVHeads != 0:
		return fmt.Errorf("num_kv_heads: %d does not divide num_attention_heads %d", m.NumKVHeads, m.NumAttentionHeads)
	case m.HeadDim <= 0:
		return fmt.Errorf("head_dim: want > 0, got %d", m.HeadDim)
	case m.ParamCount <= 0:
		return fmt.Errorf("param_count: want > 0, got %d", m.ParamCount)
	case m.SlidingLayers < 0 || m.SlidingLayers > m.NumLayers:
		return fmt.Errorf("sliding_layers: want 0..num_layers (%d), got %d", m.NumLayers, m.SlidingLayers)
	case m.SlidingLayers > 0 && m.SlidingWindowTokens <= 0:
		return fmt.Errorf("sliding_window_tokens: want > 0 when sliding_layers is %d", m.SlidingLayers)
	case m.IntermediateSize < 0 || m.VocabSize < 0 || m.MaxPositionTokens < 0:
		return errors.New("intermediate_size, vocab_size, max_position_tokens: want >= 0")
	}
	return nil
}

// GPUs returns the catalogue's GPUs sorted by name. The slice is a copy.
func GPUs() []GPU { return slices.Clone(loadedCatalog().gpus) }

// Models returns the catalogue's models sorted by name. The slice is a copy.
func Models() []Model { return slices.Clone(loadedCatalog().models) }

// LookupGPU finds a GPU by name or alias, ignoring case, spaces and
// punctuation ("RTX A4000", "a4000", "rtx-a4000"). NVML device names such as
// "NVIDIA GeForce RTX 4090" are accepted too. An unknown name returns an
// *UnknownNameError listing close matches.
func LookupGPU(name string) (GPU, error) {
	c := loadedCatalog()
	k := normalize(name)
	if i, ok := c.gpuKey[k]; ok {
		return c.gpus[i], nil
	}
	if g, ok := MatchNVMLName(name); ok {
		return g, nil
	}
	return GPU{}, &UnknownNameError{Kind: "GPU", Name: name, Suggestions: suggest(k, c.gpuKey, func(i int) string { return c.gpus[i].Name })}
}

// LookupModel finds a model by its Hugging Face id, the id without the
// organisation, or an alias ("llama-3.1-8b"), ignoring case and punctuation.
// An unknown name returns an *UnknownNameError listing close matches.
func LookupModel(name string) (Model, error) {
	c := loadedCatalog()
	k := normalize(name)
	if i, ok := c.modelKey[k]; ok {
		return c.models[i], nil
	}
	return Model{}, &UnknownNameError{Kind: "model", Name: name, Suggestions: suggest(k, c.modelKey, func(i int) string { return c.models[i].Name })}
}

// MatchNVMLName maps a device name as NVML reports it ("NVIDIA RTX A4000",
// "NVIDIA GeForce RTX 4090", "NVIDIA H200") to its catalogue entry. It tries
// the catalogue's nvml_names first, then the name without the "NVIDIA" and
// "GeForce" words as a name or alias. It never guesses by substring: a card
// that is not listed (an A10G, say) is reported as not found.
func MatchNVMLName(nvmlName string) (GPU, bool) {
	c := loadedCatalog()
	if i, ok := c.nvmlKey[normalize(nvmlName)]; ok {
		return c.gpus[i], true
	}
	var kept []string
	for _, w := range strings.Fields(nvmlName) {
		if lw := strings.ToLower(w); lw != "nvidia" && lw != "geforce" {
			kept = append(kept, w)
		}
	}
	if i, ok := c.gpuKey[normalize(strings.Join(kept, " "))]; ok {
		return c.gpus[i], true
	}
	return GPU{}, false
}

// UnknownNameError is returned by LookupGPU and LookupModel.
type UnknownNameError struct {
	Kind        string   // "GPU" or "model"
	Name        string   // as asked
	Suggestions []string // catalogue names, closest first; may be empty
}

func (e *UnknownNameError) Error() string {
	list := "warden gpus --catalog"
	if e.Kind == "model" {
		list = "--model-config PATH loads any Hugging Face config.json"
	}
	if len(e.Suggestions) == 0 {
		return fmt.Sprintf("unknown %s %q (%s)", e.Kind, e.Name, list)
	}
	return fmt.Sprintf("unknown %s %q; did you mean %s? (%s)", e.Kind, e.Name, strings.Join(e.Suggestions, ", "), list)
}

// normalize folds case and drops everything but letters and digits.
func normalize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// suggest returns up to five entry names whose name or alias is within a
// small edit distance of key or contains it (or is contained in it), closest
// first and then by name, so the order is deterministic.
func suggest(key string, idx map[string]int, nameOf func(int) string) []string {
	if key == "" {
		return nil
	}
	best := map[int]int{} // entry -> smallest score
	for k, i := range idx {
		d := levenshtein.ComputeDistance(key, k)
		limit := max(2, len(key)/3)
		if strings.Contains(k, key) || strings.Contains(key, k) {
			d = min(d, 1)
		} else if d > limit {
			continue
		}
		if old, ok := best[i]; !ok || d < old {
			best[i] = d
		}
	}
	type cand struct {
		name  string
		score int
	}
	var cs []cand
	for i, d := range best {
		cs = append(cs, cand{nameOf(i), d})
	}
	slices.SortFunc(cs, func(a, b cand) int {
		if a.score != b.score {
			return a.score - b.score
		}
		return strings.Compare(a.name, b.name)
	})
	var out []string
	for _, c := range cs[:min(len(cs), 5)] {
		out = append(out, c.name)
	}
	return out
}
