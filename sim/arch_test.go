package sim

import (
	"go/build"
	"os/exec"
	"strings"
	"testing"
)

// TestArchitecture keeps the simulator pure computation over virtual time:
// its own files import neither net/http nor the live proxy, and nothing it
// depends on, directly or not, is live, planner or web (those import sim).
// (net/http does reach the binary through Prometheus's promql engine, which
// metrics wraps; sim itself never serves or fetches anything.)
func TestArchitecture(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range pkg.Imports {
		if imp == "net/http" || strings.HasPrefix(imp, "net/http/") || imp == "net" {
			t.Errorf("sim imports %s", imp)
		}
		if strings.HasPrefix(imp, "github.com/lm-warden/warden/live") {
			t.Errorf("sim imports %s", imp)
		}
	}
	out, err := exec.Command("go", "list", "-deps", "github.com/lm-warden/warden/sim").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, bad := range []string{"live", "planner", "web", "cmd"} {
			if p := "github.com/lm-warden/warden/" + bad; dep == p || strings.HasPrefix(dep, p+"/") {
				t.Errorf("sim depends on %s", dep)
			}
		}
	}
}
