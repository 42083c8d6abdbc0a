package vllm

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParse(t *testing.T) {
	f, err := os.Open("testdata/vllm_metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, err := Parse(f, MaxPageBytes)
	if err != nil {
		t.Fatal(err)
	}
	want := []Engine{
		{Engine: 0, Running: 3, Waiting: 0, KVUsage: 0.25, PrefixQueries: 120000, PrefixHits: 90000,
			PromptTokens: 130000, GenerationTokens: 5000, BlockSize: 16, NumGPUBlocks: 2443},
		{Engine: 1, Running: 7, Waiting: 2, KVUsage: 0.875, PrefixQueries: 80000, PrefixHits: 20000,
			PromptTokens: 85000, GenerationTokens: 4000, BlockSize: 16, NumGPUBlocks: 2441},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("Parse (-want +got):\n%s", d)
	}
}

func TestParseEdgeCases(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       []Engine
		wantErr    bool
	}{
		{"empty", "", nil, false},
		{"no engine label", "vllm:num_requests_running{model_name=\"m\"} 2\n", []Engine{{Running: 2}}, false},
		{"bad engine label skipped", "vllm:num_requests_running{engine=\"x\"} 2\n", nil, false},
		{"max_num_seqs from a config info", "vllm:scheduler_config_info{engine=\"0\",max_num_seqs=\"32\"} 1\n", []Engine{{MaxNumSeqs: 32}}, false},
		{"two models summed", "vllm:num_requests_waiting{engine=\"0\",model_name=\"a\"} 1\nvllm:num_requests_waiting{engine=\"0\",model_name=\"b\"} 2\n", []Engine{{Waiting: 3}}, false},
		{"prefill time histogram", "# TYPE vllm:request_prefill_time_seconds histogram\n" +
			"vllm:request_prefill_time_seconds_bucket{engine=\"1\",le=\"0.5\"} 2\nvllm:request_prefill_time_seconds_bucket{engine=\"1\",le=\"+Inf\"} 3\n" +
			"vllm:request_prefill_time_seconds_sum{engine=\"1\"} 2.25\nvllm:request_prefill_time_seconds_count{engine=\"1\"} 3\n",
			[]Engine{{Engine: 1, PrefillSeconds: 2.25, PrefillRequests: 3, HasPrefill: true}}, false},
		{"requests and preemptions", "vllm:request_success_total{engine=\"0\",finished_reason=\"stop\"} 3\n" +
			"vllm:request_success_total{engine=\"0\",finished_reason=\"length\"} 2\nvllm:num_preemptions_total{engine=\"0\"} 1\n",
			[]Engine{{Requests: 5, Preemptions: 1}}, false},
		{"garbage", "vllm:num_requests_running{engine=\"0\" 3\n", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(strings.NewReader(tc.text), MaxPageBytes)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	seed, err := os.ReadFile("testdata/vllm_metrics.txt")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(seed))
	f.Add("vllm:num_requests_running{engine=\"0\"} NaN\n")
	f.Add("# TYPE x counter\nx_total 1\n")
	f.Fuzz(func(t *testing.T, text string) {
		got, err := Parse(strings.NewReader(text), MaxPageBytes)
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
// all are read, sorted (issue 35, item 6: BenchmarkParse64kEngines
// times it).
func TestParseManyEngines(t *testing.T) {
	const n = 1<<16 + 1
	got, err := Parse(bytes.NewReader(manyEnginesPage(n)), MaxPageBytes)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("%d engines, want %d", len(got), n)
	}
	for i, e := range got {
		if e.Engine != i || e.Running != 1 || e.Waiting != 1 {
			t.Fatalf("engine %d: %+v", i, e)
		}
	}
}
