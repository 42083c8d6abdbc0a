package live

import (
	"github.com/lm-warden/warden/internal/archtest"
	"os/exec"
	"strings"
	"testing"
)

// TestNoPrometheusServer keeps the proxy light: it names its series from
// metrics/names and never links the Prometheus server code (PromQL, TSDB);
// client_golang, which serves /metrics, is fine.
func TestNoPrometheusServer(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/lm-warden/warden/live").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/prometheus/prometheus/") || dep == "github.com/lm-warden/warden/metrics" {
			t.Errorf("live depends on %s", dep)
		}
	}
}

// above are the packages above the proxy in the layers: the front ends
// and commands that drive it, and the simulation half of the binary.
var above = []string{"epp/...", "cmd/...", "web/...", "sim/...", "planner/...", "bench/...", "emulator/...", "calibrate/..."}

// TestArchitecture keeps live where ARCHITECTURE.md puts it: it imports
// placement (never sim), traces for its journal, hardware, kvevents,
// metrics/names, metrics/vllm and its own leaves, and nothing it depends on is a front
// end, a command or the simulator.
func TestArchitecture(t *testing.T) {
	archtest.Check(t, "live", archtest.Rules{
		Imports: []string{"placement", "traces", "hardware", "kvevents", "metrics/names",
			"metrics/vllm", "internal/sse", "internal/strictyaml", "live/upstream", "live/jsonscan", "live/sessionstore"},
		Never: above,
	})
}

// TestLeavesBelowLive: the packages carved out of live (issue 51) are
// leaves: they import nothing of the project, live least of all, so that
// each is read, tested and changed alone; metrics/vllm, the one parser of
// vLLM's /metrics (live's scraper, bench), imports only the series names.
func TestLeavesBelowLive(t *testing.T) {
	for pkg, imports := range map[string][]string{
		"live/upstream": nil, "live/jsonscan": nil, "live/sessionstore": nil,
		"metrics/vllm": {"metrics/names"},
	} {
		t.Run(pkg, func(t *testing.T) {
			archtest.Check(t, pkg, archtest.Rules{Imports: imports, Never: append([]string{"live"}, above...)})
		})
	}
}
