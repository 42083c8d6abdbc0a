package live

import (
	"log/slog"
	"reflect"
	"testing"
)

// TestReloadReplacesOnEveryModelKey: a reload that changes any key of a
// model replaces the model (a successor with its sessions and in-flight
// counts handed over), so that the change takes effect: a kept model
// keeps its old configuration. Every key of ModelCfg but name (the
// model's identity) has its change here; a key added to ModelCfg without
// one fails the test. kv_events was kept unchanged before (its
// subscriptions stayed on the old endpoints).
func TestReloadReplacesOnEveryModelKey(t *testing.T) {
	const (
		head = "  - name: " + testModel + "\n"
		two  = "    replicas: [http://127.0.0.1:1, http://127.0.0.1:2]\n"
		dial = "    kv_events:\n      endpoints: [tcp://127.0.0.1:5557, tcp://127.0.0.1:5558]\n"
		lis  = "    kv_events:\n      listen: tcp://127.0.0.1:5557\n"
	)
	cases := []struct{ key, before, after string }{
		{"url", "    url: http://127.0.0.1:1\n    data_parallel_size: 2\n", "    url: http://127.0.0.1:3\n    data_parallel_size: 2\n"},
		{"data_parallel_size", "    url: http://127.0.0.1:1\n    data_parallel_size: 2\n", "    url: http://127.0.0.1:1\n    data_parallel_size: 3\n"},
		{"replicas", two, "    replicas: [http://127.0.0.1:1]\n"},
		{"max_num_seqs", two, two + "    max_num_seqs: 64\n"},
		{"gpu", two, two + "    gpu: H100\n"},
		{"strategy", two, two + "    strategy: hash\n"},
		{"affinity", two, two + "    affinity: off\n"},
		{"spill_threshold", two, two + "    spill_threshold: 3\n"},
		{"session_ttl", two, two + "    session_ttl: 10m\n"},
		{"max_sessions", two, two + "    max_sessions: 10\n"},
		{"active_window", two, two + "    active_window: 1m\n"},
		{"balance", two, two + "    balance: kv\n"},
		{"admission", two, two + "    admission: kv\n"},
		{"admission_timeout", two + "    admission: kv\n", two + "    admission: kv\n    admission_timeout: 5s\n"},
		{"rehome", two, two + "    rehome: cold\n"},
		{"prefix", two + dial, two + "    prefix: held\n" + dial},
		{"prefill_tokens_per_s", two + "    spill_threshold: priced\n    prefill_tokens_per_s: 1000\n", two + "    spill_threshold: priced\n    prefill_tokens_per_s: 2000\n"},
		{"kv_events", two, two + dial},
		{"kv_events.endpoint", two + dial, two + "    kv_events:\n      endpoint: tcp://127.0.0.1:5557\n"},
		{"kv_events.endpoints", two + dial, two + "    kv_events:\n      endpoints: [tcp://127.0.0.1:5557, tcp://127.0.0.1:5559]\n"},
		{"kv_events.replay_endpoint", two + dial, two + dial + "      replay_endpoint: tcp://127.0.0.1:5600\n"},
		{"kv_events.replay_endpoints", two + dial, two + dial + "      replay_endpoints: [tcp://127.0.0.1:5600, tcp://127.0.0.1:5601]\n"},
		{"kv_events.listen", two + dial, two + lis},
		{"kv_events.listen_ranks", two + lis, two + lis + "      listen_ranks: 2\n"},
		{"kv_events.topics", two + lis, two + lis + "      topics: [a, b]\n"},
		{"kv_events.max_publishers", two + lis, two + lis + "      max_publishers: 3\n"},
		{"kv_events.topic", two + dial, two + dial + "      topic: kv@\n"},
		{"kv_events.max_blocks", two + dial, two + dial + "      max_blocks: 100\n"},
		{"kv_events.max_batches_per_second", two + dial, two + dial + "      max_batches_per_second: 10\n"},
		{"kv_events.max_hashes_per_second", two + dial, two + dial + "      max_hashes_per_second: 10\n"},
	}
	covered := map[string]bool{"name": true}
	for _, c := range cases {
		covered[c.key] = true
		t.Run(c.key, func(t *testing.T) {
			parse := func(model string) *Config {
				cfg, err := ParseConfig("reload.yaml", []byte("listen: 127.0.0.1:0\n"+modelsYAML("", head+model)))
				if err != nil {
					t.Fatal(err)
				}
				return cfg
			}
			srv, err := NewServer(parse(c.before), WithLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				t.Fatal(err)
			}
			before := srv.state.Load().models[testModel]
			if err := srv.Reload(parse(c.before)); err != nil {
				t.Fatal(err)
			}
			if srv.state.Load().models[testModel] != before {
				t.Fatal("a reload that changes nothing replaced the model")
			}
			if err := srv.Reload(parse(c.after)); err != nil {
				t.Fatal(err)
			}
			if srv.state.Load().models[testModel] == before {
				t.Errorf("a reload that changes %s kept the model as it was (the change would not apply)", c.key)
			}
		})
	}
	for _, key := range yamlKeys(reflect.TypeFor[ModelCfg](), "") {
		if !covered[key] {
			t.Errorf("models[].%s: no case changes it; add one", key)
		}
	}
}
