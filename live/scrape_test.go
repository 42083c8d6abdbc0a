package live

import (
	"github.com/lm-warden/warden/metrics/vllm"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Each engine of a page, even one that carries every engine label the
// parser accepts (0 to 65,536), is found by ScrapeResult.engine; a sparse
// list finds only its own.
func TestScrapeResultEngine(t *testing.T) {
	const n = 1<<16 + 1
	got := make([]EngineStats, n)
	for i := range got {
		got[i] = EngineStats{Engine: i, Running: 1, Waiting: 1}
	}
	r := &ScrapeResult{Engines: got}
	for _, e := range []int{0, 1, 4095, n - 1} {
		if s, ok := r.engine(e); !ok || s.Engine != e || s.Running != 1 || s.Waiting != 1 {
			t.Errorf("engine %d: %+v %v", e, s, ok)
		}
	}
	sparse := &ScrapeResult{Engines: []EngineStats{{Engine: 2}, {Engine: 5}, {Engine: 9}}}
	for e, want := range map[int]bool{0: false, 2: true, 5: true, 6: false, 9: true, 10: false, -1: false} {
		if s, ok := sparse.engine(e); ok != want || ok && s.Engine != e {
			t.Errorf("sparse engine %d: %+v %v, want found %v", e, s, ok, want)
		}
	}
}

// A max_num_seqs read from a server is clamped (issue 35, item 8): 2^30
// made the auto spill threshold 268,435,456, so that a home was never
// left. A configured one is taken as it is.
func TestServerMaxNumSeqsClamped(t *testing.T) {
	for _, tc := range []struct {
		label      string
		configured int
		want       int
	}{
		{"1073741824", 0, vllm.MaxServerNumSeqs},
		{"16385", 0, vllm.MaxServerNumSeqs},
		{"1024", 0, 1024},
		{"1073741824", 100000, 100000},
	} {
		page := `vllm:scheduler_config_info{engine="0",max_num_seqs="` + tc.label + `"} 1` + "\n"
		engines, err := vllm.Parse(strings.NewReader(page), vllm.MaxPageBytes)
		if err != nil {
			t.Fatal(err)
		}
		m, err := newModel(ModelCfg{Name: "m", Replicas: []string{"http://127.0.0.1:1"}, MaxNumSeqs: tc.configured,
			SpillThreshold: Spill{Auto: true}, SessionTTL: Duration(time.Minute), MaxSessions: 10}, http.DefaultClient, time.Second, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		m.servers[0].last.Store(&ScrapeResult{Seq: 1, Engines: engines, Healthy: true})
		if n, _ := m.maxNumSeqs(); n != tc.want || m.spillThreshold() != tc.want/4 {
			t.Errorf("server says %s, configured %d: max_num_seqs %d, spill threshold %d; want %d and %d",
				tc.label, tc.configured, n, m.spillThreshold(), tc.want, tc.want/4)
		}
	}
}
