package live

import (
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
