package live

import (
	"flag"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/placement"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

func TestExampleConfig(t *testing.T) {
	cfg, err := LoadConfig("testdata/proxy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Models) != 3 {
		t.Fatalf("%d models, want 3", len(cfg.Models))
	}
	dp, urls := cfg.Models[0], cfg.Models[1]
	dpPub, dpReplay, err := dp.KVEvents.endpoints("models[0]", dp.NumReplicas())
	if err != nil {
		t.Fatal(err)
	}
	urlsPub, urlsReplay, err := urls.KVEvents.endpoints("models[1]", urls.NumReplicas())
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"admin", cfg.Admin, "127.0.0.1:9091"},
		{"dp layout", dp.Layout(), LayoutDP},
		{"dp replicas", dp.NumReplicas(), 4},
		{"dp affinity", dp.EffectiveStrategy(), "affinity"},
		{"dp spill auto", dp.SpillThreshold.Auto, true},
		{"urls layout", urls.Layout(), LayoutURLs},
		{"urls replicas", urls.NumReplicas(), 3},
		{"urls spill", urls.SpillThreshold, Spill{N: 12}},
		{"urls ttl default", urls.SessionTTL.D(), 30 * time.Minute},
		{"dp active window", dp.ActiveWindow.D(), 10 * time.Minute},
		{"urls active window default (learned)", urls.ActiveWindow.D(), time.Duration(0)},
		{"body limit", cfg.Limits.MaxBodyBytes, ByteSize(16 << 20)},
		{"drain", cfg.Timeouts.Drain.D(), 60 * time.Second},
		{"first_token", cfg.Timeouts.FirstToken.D(), DefaultFirstToken},
		{"stream_idle", cfg.Timeouts.StreamIdle.D(), DefaultStreamIdle},
		{"max_in_flight default", cfg.Limits.MaxInFlight, DefaultMaxInFlight()},
		{"dp gpu", dp.GPU, "RTX A4000"},
		{"client_write", cfg.Timeouts.ClientWrite.D(), DefaultClientWrite},
		{"max_connections default", cfg.Limits.MaxConnections, DefaultMaxConnections()},
		{"admin_hosts", len(cfg.AdminHosts), 0},
		{"dp rehome", dp.Rehome, "off"},
		{"dp kv_events rank 3", dpPub[3], "tcp://10.0.0.10:5560"},
		{"dp kv_events replay rank 3", dpReplay[3], "tcp://10.0.0.10:5570"},
		{"urls kv_events replica 2", urlsPub[2], "tcp://10.0.1.3:5557"},
		{"urls kv_events replay replica 2", urlsReplay[2], "tcp://10.0.1.3:5558"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

// TestConfigErrors checks each broken file under testdata/config against
// its golden .err (rewrite with -update).
func TestConfigErrors(t *testing.T) {
	files, err := filepath.Glob("testdata/config/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			_, err := LoadConfig(f)
			if err == nil {
				t.Fatal("loaded without error")
			}
			golden := strings.TrimSuffix(f, ".yaml") + ".err"
			got := err.Error() + "\n"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update)", err)
			}
			if got != string(want) {
				t.Errorf("error =\n%s\nwant\n%s", got, want)
			}
		})
	}
}

// The proxy refuses spill threshold 0 with placement's own message, as the
// planner and the simulator do.
func TestConfigSpillThresholdZero(t *testing.T) {
	base := "listen: :1\nauth: passthrough\nmodels:\n  - name: m\n    replicas: [http://a:1]\n"
	for _, v := range []string{"0", "-2", "lots"} {
		_, err := ParseConfig("t.yaml", []byte(base+"    spill_threshold: "+v+"\n"))
		want := "t.yaml:6: models[0].spill_threshold: " + placement.SpillThresholdError(v)
		if err == nil || err.Error() != want {
			t.Errorf("spill_threshold %s: error %v, want %q", v, err, want)
		}
	}
}

func TestAffinityOffAndStrategyConflict(t *testing.T) {
	base := "listen: :1\nauth: passthrough\nmodels:\n  - name: m\n    replicas: [http://a:1]\n"
	cfg, err := ParseConfig("t.yaml", []byte(base+"    affinity: off\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Models[0].EffectiveStrategy(); got != "least-loaded" {
		t.Errorf("affinity off: strategy %q, want least-loaded", got)
	}
	_, err = ParseConfig("t.yaml", []byte(base+"    affinity: on\n    strategy: hash\n"))
	if err == nil || !strings.Contains(err.Error(), "t.yaml:6: models[0].affinity:") {
		t.Errorf("conflict error = %v, want one naming t.yaml:6 and models[0].affinity", err)
	}
}

// TestConfigFileSizeBounded (issue 46, item 8): a configuration file over
// MaxConfigBytes is refused with an error naming it, without being read
// whole: a 100 MB file (sparse) by its size, an endless one (/dev/zero)
// after MaxConfigBytes + 1 bytes. Before: read whole and decoded (100 MB
// allocated at once; a reload of one left the proxy at 632 MB RSS).
func TestConfigFileSizeBounded(t *testing.T) {
	big := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(big, []byte("listen: :8080\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, 100<<20); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{big, "/dev/zero"} {
		if _, err := os.Stat(path); err != nil {
			t.Logf("%s: %v", path, err)
			continue
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := LoadConfig(path)
		runtime.ReadMemStats(&after)
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "more than the 1048576 bytes") {
			t.Errorf("%s: err = %v, want it refused as too large, naming the file", path, err)
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
			t.Errorf("%s: %d MiB allocated to refuse it", path, grew>>20)
		} else {
			t.Logf("%s: %v (%d KiB allocated)", path, err, grew>>10)
		}
	}
}

// TestConfigStrategyFromRegistry: models[].strategy takes the registry's
// names that the proxy serves, and the error lists them.
func TestConfigStrategyFromRegistry(t *testing.T) {
	base := "listen: :1\nauth: passthrough\nmodels:\n  - name: m\n    replicas: [http://a:1]\n"
	for _, s := range placement.ProxyStrategies() {
		if _, err := ParseConfig("t.yaml", []byte(base+"    strategy: "+s+"\n")); err != nil {
			t.Errorf("strategy %s: %v", s, err)
		}
	}
	_, err := ParseConfig("t.yaml", []byte(base+"    strategy: random\n"))
	want := `t.yaml:6: models[0].strategy: want one of ` + strings.Join(placement.ProxyStrategies(), ", ") + `, got "random"`
	if err == nil || err.Error() != want {
		t.Errorf("error %v, want %q", err, want)
	}
	// A peer's router is the registry's too, but the proxy does not serve it.
	_, err = ParseConfig("t.yaml", []byte(base+"    strategy: "+placement.PeerDynamo+"\n"))
	if want := "models[0].strategy: dynamo runs in warden sim, plan and tune only"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("error %v, want %q", err, want)
	}
}
