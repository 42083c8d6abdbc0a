package live

import (
	"bytes"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseVLLMMetrics(t *testing.T) {
	f, err := os.Open("testdata/vllm_metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, err := ParseVLLMMetrics(f)
	if err != nil {
		t.Fatal(err)
	}
	want := []EngineStats{
		{Engine: 0, Running: 3, Waiting: 0, KVUsage: 0.25, PrefixQueries: 120000, PrefixHits: 90000,
			PromptTokens: 130000, GenerationTokens: 5000, BlockSize: 16, NumGPUBlocks: 2443},
		{Engine: 1, Running: 7, Waiting: 2, KVUsage: 0.875, PrefixQueries: 80000, PrefixHits: 20000,
			PromptTokens: 85000, GenerationTokens: 4000, BlockSize: 16, NumGPUBlocks: 2441},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("ParseVLLMMetrics (-want +got):\n%s", d)
	}
}

func TestParseVLLMMetricsEdgeCases(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       []EngineStats
		wantErr    bool
	}{
		{"empty", "", nil, false},
		{"no engine label", "vllm:num_requests_running{model_name=\"m\"} 2\n", []EngineStats{{Running: 2}}, false},
		{"bad engine label skipped", "vllm:num_requests_running{engine=\"x\"} 2\n", nil, false},
		{"max_num_seqs from a config info", "vllm:scheduler_config_info{engine=\"0\",max_num_seqs=\"32\"} 1\n", []EngineStats{{MaxNumSeqs: 32}}, false},
		{"two models summed", "vllm:num_requests_waiting{engine=\"0\",model_name=\"a\"} 1\nvllm:num_requests_waiting{engine=\"0\",model_name=\"b\"} 2\n", []EngineStats{{Waiting: 3}}, false},
		{"prefill time histogram", "# TYPE vllm:request_prefill_time_seconds histogram\n" +
			"vllm:request_prefill_time_seconds_bucket{engine=\"1\",le=\"0.5\"} 2\nvllm:request_prefill_time_seconds_bucket{engine=\"1\",le=\"+Inf\"} 3\n" +
			"vllm:request_prefill_time_seconds_sum{engine=\"1\"} 2.25\nvllm:request_prefill_time_seconds_count{engine=\"1\"} 3\n",
			[]EngineStats{{Engine: 1, PrefillSeconds: 2.25, PrefillRequests: 3, HasPrefill: true}}, false},
		{"garbage", "vllm:num_requests_running{engine=\"0\" 3\n", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseVLLMMetrics(strings.NewReader(tc.text))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func FuzzParseVLLMMetrics(f *testing.F) {
	seed, err := os.ReadFile("testdata/vllm_metrics.txt")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(seed))
	f.Add("vllm:num_requests_running{engine=\"0\"} NaN\n")
	f.Add("# TYPE x counter\nx_total 1\n")
	f.Fuzz(func(t *testing.T, text string) {
		got, err := ParseVLLMMetrics(strings.NewReader(text))
		if err != nil {
			return
		}
		for i := 1; i < len(got); i++ {
			if got[i-1].Engine >= got[i].Engine {
				t.Fatalf("engines not sorted and unique: %+v", got)
			}
		}
	})
}

// A page may carry every engine label the parser accepts (0 to 65,536):
// all are read, sorted, and each is found by ScrapeResult.engine (issue
// 35, item 6: BenchmarkParseVLLMMetrics64kEngines times it).
func TestParseVLLMMetricsManyEngines(t *testing.T) {
	const n = 1<<16 + 1
	got, err := ParseVLLMMetrics(bytes.NewReader(manyEnginesPage(n)))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("%d engines, want %d", len(got), n)
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
		{"1073741824", 0, maxServerNumSeqs},
		{"16385", 0, maxServerNumSeqs},
		{"1024", 0, 1024},
		{"1073741824", 100000, 100000},
	} {
		page := `vllm:scheduler_config_info{engine="0",max_num_seqs="` + tc.label + `"} 1` + "\n"
		engines, err := ParseVLLMMetrics(strings.NewReader(page))
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
