package sim

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lm-warden/warden/hardware"
)

// TestVLLMVersionTable prints the version table and what every release
// from 0.13 to 0.28 does for a Qwen3 and a Llama dense model, each switch
// with its PR, code, merge date and the evidence of its first release
// (testdata/vllm/versions-*.golden; -update rewrites them).
func TestVLLMVersionTable(t *testing.T) {
	for _, c := range []struct{ model, golden string }{
		{"Qwen/Qwen3-4B-Instruct-2507", "versions-qwen3-4b.golden"},
		{"meta-llama/Llama-3.1-8B-Instruct", "versions-llama-3.1-8b.golden"},
	} {
		m, err := hardware.LookupModel(c.model)
		if err != nil {
			t.Fatal(err)
		}
		checkGolden(t, filepath.Join("testdata", "vllm", c.golden), VLLMVersionTable(m, [2]int{0, 13}, [2]int{0, 28}))
	}
}

// TestVLLMBehaviourFor pins the switches the product's benchmark and the
// known releases turn on.
func TestVLLMBehaviourFor(t *testing.T) {
	qwen, err := hardware.LookupModel("Qwen/Qwen3-4B-Instruct-2507")
	if err != nil {
		t.Fatal(err)
	}
	llama, err := hardware.LookupModel("meta-llama/Llama-3.1-8B-Instruct")
	if err != nil {
		t.Fatal(err)
	}
	gemma, err := hardware.LookupModel("google/gemma-3-27b-it")
	if err != nil {
		t.Fatal(err)
	}
	moe, err := hardware.LoadHFConfig(filepath.Join("..", "hardware", "testdata", "qwen3-30b-a3b.config.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		m       hardware.Model
		version [2]int
		want    VLLMBehaviour
	}{
		{"0.26, the published benchmark", qwen, [2]int{0, 26}, VLLMBehaviour{ReserveFullISL: true, StatsAtAdmission: false, Balancer: DPBlindRotating, ModelRunner: ModelRunnerV2}},
		{"0.27: #48860 and #49204", qwen, [2]int{0, 27}, VLLMBehaviour{ReserveFullISL: true, StatsAtAdmission: true, Balancer: DPPublishedInFlight, ModelRunner: ModelRunnerV2}},
		{"0.24: fixed start, blind", qwen, [2]int{0, 24}, VLLMBehaviour{ReserveFullISL: true, Balancer: DPBlindFixed, ModelRunner: ModelRunnerV2}},
		{"0.22: V2 for Qwen3 only", llama, [2]int{0, 22}, VLLMBehaviour{ReserveFullISL: true, Balancer: DPBlindFixed, ModelRunner: ModelRunnerV1}},
		{"0.23: V2 for Llama", llama, [2]int{0, 23}, VLLMBehaviour{ReserveFullISL: true, Balancer: DPBlindFixed, ModelRunner: ModelRunnerV2}},
		{"0.24: Gemma still V1", gemma, [2]int{0, 24}, VLLMBehaviour{ReserveFullISL: true, Balancer: DPBlindFixed, ModelRunner: ModelRunnerV1}},
		{"0.25: V2 for every dense model", gemma, [2]int{0, 25}, VLLMBehaviour{ReserveFullISL: true, Balancer: DPBlindRotating, ModelRunner: ModelRunnerV2}},
		{"0.13: before #30739, counts published", qwen, [2]int{0, 13}, VLLMBehaviour{Balancer: DPPublishedFixed, ModelRunner: ModelRunnerV1}},
		{"MoE: DPEngineCoreProc publishes", moe, [2]int{0, 26}, VLLMBehaviour{ReserveFullISL: true, Balancer: DPPublishedFixed, ModelRunner: ModelRunnerV1}},
	} {
		got := VLLMBehaviourFor(c.version, c.m)
		if (got.ModelRunner == ModelRunnerV2) != (got.ModelRunnerSwitch != "") {
			t.Errorf("%s: runner %s with switch %q", c.name, got.ModelRunner, got.ModelRunnerSwitch)
		}
		got.ModelRunnerSwitch = ""
		c.want.Version = c.version
		c.want.RepublishIntervalUs = DefaultRepublishInterval
		if got != c.want {
			t.Errorf("%s: %+v\nwant %+v", c.name, got, c.want)
		}
	}
}

func TestParseVLLMVersion(t *testing.T) {
	for _, c := range []struct {
		in   string
		want [2]int
		ok   bool
	}{
		{"0.26", [2]int{0, 26}, true},
		{"0.26.0", [2]int{0, 26}, true},
		{"v0.27.1", [2]int{0, 27}, true},
		{" 0.28 ", [2]int{0, 28}, true},
		{"0.13.2", [2]int{0, 13}, true},
		{"0.99", [2]int{}, false}, // well formed, but no release the table knows
		{"0.12", [2]int{}, false},
		{"1.0", [2]int{}, false},
		{"0", [2]int{}, false},
		{"0.26.0.1", [2]int{}, false},
		{"latest", [2]int{}, false},
		{"0.x", [2]int{}, false},
	} {
		got, err := ParseVLLMVersion(c.in)
		if (err == nil) != c.ok || (c.ok && got != c.want) {
			t.Errorf("ParseVLLMVersion(%q) = %v, %v; want %v, ok %t", c.in, got, err, c.want, c.ok)
		}
	}
}

// VLLMVersionTable writes the table: every switch with its PR, code, merge
// date, first release and evidence, then what each release from first to
// last does for m.
func VLLMVersionTable(m hardware.Model, first, last [2]int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "vLLM behaviour switches the simulator models (vllm.version; default %s)\n\n", DefaultVLLMVersion)
	for _, s := range vllmSwitches {
		fmt.Fprintf(&b, "%s (since %d.%d)\n", s.Key, s.Since[0], s.Since[1])
		fmt.Fprintf(&b, "  what      %s\n", s.What)
		fmt.Fprintf(&b, "  PR        vllm-project/vllm%s, merged %s\n", s.PR, s.Merged)
		fmt.Fprintf(&b, "  code      %s\n", s.Code)
		fmt.Fprintf(&b, "  evidence  %s\n", s.Evidence)
		if s.Applies != nil {
			fmt.Fprintf(&b, "  applies   to %s: %t\n", m.Name, s.Applies(m))
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "by release, for %s\n", m.Name)
	fmt.Fprintf(&b, "%-8s %-16s %-18s %-7s %s\n", "release", "reserve_full_isl", "stats_at_admission", "runner", "DP balancer")
	for v := first; !versionAtLeast(v, [2]int{last[0], last[1] + 1}); v[1]++ {
		bh := VLLMBehaviourFor(v, m)
		fmt.Fprintf(&b, "%-8s %-16t %-18t %-7s %s\n", fmt.Sprintf("%d.%d", v[0], v[1]), bh.ReserveFullISL, bh.StatsAtAdmission, bh.ModelRunner, bh.Balancer)
	}
	return b.String()
}

// TestUnknownVLLMReleaseRefused: a well-formed release the table was not
// audited for is an error that lists the known ones, in a farm spec too
// (it used to be taken silently as the newest).
func TestUnknownVLLMReleaseRefused(t *testing.T) {
	_, err := ParseVLLMVersion("0.99")
	if err == nil || !strings.Contains(err.Error(), "0.13 to 0.28") || !strings.Contains(err.Error(), "0.26, 0.27") {
		t.Fatalf("ParseVLLMVersion(0.99) error = %v, want the known releases listed", err)
	}
	_, err = ParseFarm([]byte("model: Qwen/Qwen3-4B-Instruct-2507\ngpu: RTX A4000\nreplicas: 2\nvllm:\n  version: \"0.99\"\n"), "f.yaml")
	if err == nil || !strings.Contains(err.Error(), "vllm.version") || !strings.Contains(err.Error(), "0.28") {
		t.Fatalf("farm with vllm.version 0.99: error = %v", err)
	}
}
