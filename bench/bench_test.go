package bench

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lm-warden/warden/emulator"
	"github.com/lm-warden/warden/internal/fakevllm"
	"github.com/lm-warden/warden/traces"
)

// newFakeServer is a fake vLLM farm of engines for bench: sticky on the
// session header, as the proxy keeps a session home, and answering each
// request its max_tokens, as vLLM does with ignore_eos.
func newFakeServer(t *testing.T, engines int) *fakevllm.Server {
	f := fakevllm.New(t, engines)
	f.SessionHeader = HeaderSessionID
	f.MaxTokens = true
	return f
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tinyWorkload is small enough for a step of a few hundred milliseconds.
func tinyWorkload() traces.Workload {
	return traces.Workload{
		SystemPromptTokens: 64, FirstMessageTokens: 80, FirstMessageSpread: 0.2, Turns: 3,
		NewTokensPerTurn: 20, MaxOutputTokens: 8, OutputTokens: traces.OutputLognormal, OutputTokensMean: 6, OutputTokensSigma: 0.3,
	}
}

func tinyConfig(target string) Config {
	return Config{
		Target: target, Sessions: []int{2, 3}, Step: 400 * time.Millisecond, Seed: 7,
		Workload: tinyWorkload(), SampleInterval: 20 * time.Millisecond, IgnoreEOS: true,
	}
}

func TestRunAgainstFakeServer(t *testing.T) {
	for _, api := range []API{OpenAI, Anthropic} {
		t.Run(string(api), func(t *testing.T) {
			f := newFakeServer(t, 2)
			f.TTFT = 5 * time.Millisecond
			f.TokenDelay = time.Millisecond
			cfg := tinyConfig(f.URL())
			cfg.API = api
			cfg.Label = "affinity"
			res, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if res.Model != "fake-model" {
				t.Errorf("model %q, want fake-model (from /v1/models)", res.Model)
			}
			if len(res.Report.Rows) != 2 || len(res.Steps) != 2 {
				t.Fatalf("%d rows, %d steps: want 2 each", len(res.Report.Rows), len(res.Steps))
			}
			for i, row := range res.Report.Rows {
				st := res.Steps[i]
				if row.Strategy != "affinity" || row.Sessions != cfg.Sessions[i] {
					t.Errorf("row %d: strategy %q sessions %d", i, row.Strategy, row.Sessions)
				}
				if st.Finished == 0 || row.Finished != st.Finished || st.Failed != 0 {
					t.Errorf("row %d: finished %d (stats %d), failed %d", i, row.Finished, st.Finished, st.Failed)
				}
				// TTFB includes the fake's 5 ms (and a token delay) before
				// the first token.
				if !(row.TTFBP50 > 0.005) || !(row.TTFBP95 >= row.TTFBP50) || !(st.TTFBExactP50 >= 0.005) {
					t.Errorf("row %d: TTFB p50 %v p95 %v exact p50 %v: want >= 5ms and ordered", i, row.TTFBP50, row.TTFBP95, st.TTFBExactP50)
				}
				if !(row.OutputTokensPerMin > 0) || !(row.DurationS > 0) {
					t.Errorf("row %d: output tokens/min %v, duration %v", i, row.OutputTokensPerMin, row.DurationS)
				}
				if !(row.PrefixHitPct > 0 && row.PrefixHitPct < 100) {
					t.Errorf("row %d: prefix hit %v %%, want between 0 and 100", i, row.PrefixHitPct)
				}
				if math.IsNaN(float64(row.ReplicasBusy)) || row.ReplicasBusy > 2 {
					t.Errorf("row %d: replicas busy %v, want a mean within [0, 2]", i, row.ReplicasBusy)
				}
				if !math.IsNaN(float64(row.StayedPct)) {
					t.Errorf("row %d: stayed %v without proxy metrics, want null", i, row.StayedPct)
				}
				if len(row.Replicas) != 2 {
					t.Errorf("row %d: %d replica rows, want 2", i, len(row.Replicas))
				}
			}
			checkPrompts(t, f, cfg, api)
		})
	}
}

// checkPrompts checks what the server received: the session header of
// every request, the prompt sizes of the generator (4 bytes per token of
// canonical text), and that each turn's prompt extends the previous one.
func checkPrompts(t *testing.T, f *fakevllm.Server, cfg Config, api API) {
	t.Helper()
	gen := traces.NewGenerator(cfg.Workload, 16, cfg.Seed)
	want := map[string][]int{} // session uuid -> prompt tokens per turn
	for range 200 {
		s, _ := gen.NextSession()
		for _, r := range s.Turns {
			want[SessionUUID(cfg.Seed, s.ID)] = append(want[SessionUUID(cfg.Seed, s.ID)], r.PromptTokens)
		}
	}
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	turn := map[string]int{}
	bySess := map[string][]string{} // session -> canonical texts, in order
	for i, r := range f.Requests() {
		sess := r.Header.Get(HeaderSessionID)
		if !uuid.MatchString(sess) {
			t.Fatalf("request %d: %s %q, want a UUID", i, HeaderSessionID, sess)
		}
		k := turn[sess]
		turn[sess]++
		bySess[sess] = append(bySess[sess], r.Text)
		if w := want[sess]; k >= len(w) || w[k] != r.PromptTokens {
			t.Errorf("request %d (session %s turn %d): %d prompt tokens of canonical text, want the generator's %v", i, sess, k, r.PromptTokens, w)
		}
		if r.Body["stream"] != true {
			t.Errorf("request %d: stream %v, want true", i, r.Body["stream"])
		}
		switch api {
		case Anthropic:
			md, _ := r.Body["metadata"].(map[string]any)
			uid, _ := md["user_id"].(string)
			var v struct {
				SessionID string `json:"session_id"`
			}
			if json.Unmarshal([]byte(uid), &v) != nil || v.SessionID != sess {
				t.Errorf("request %d: metadata.user_id %q, want JSON with session_id %s", i, uid, sess)
			}
			if r.Header.Get("anthropic-version") == "" {
				t.Errorf("request %d: no anthropic-version header", i)
			}
		case OpenAI:
			if r.Body["ignore_eos"] != true {
				t.Errorf("request %d: ignore_eos %v, want true", i, r.Body["ignore_eos"])
			}
		}
	}
	for sess, texts := range bySess {
		for k := 1; k < len(texts); k++ {
			if !strings.HasPrefix(texts[k], texts[k-1]) {
				t.Errorf("session %s turn %d does not extend turn %d's prompt", sess, k, k-1)
			}
		}
	}
}

func TestRunCountsMidStreamErrorsAsFailed(t *testing.T) {
	for _, api := range []API{OpenAI, Anthropic} {
		t.Run(string(api), func(t *testing.T) {
			f := newFakeServer(t, 1)
			f.FailEvery = 3
			cfg := tinyConfig(f.URL())
			cfg.API = api
			cfg.Sessions = []int{2}
			res, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			st, row := res.Steps[0], res.Report.Rows[0]
			if st.Failed == 0 || st.Finished == 0 {
				t.Fatalf("failed %d finished %d: want both", st.Failed, st.Finished)
			}
			if !strings.Contains(st.FirstError, "fake failure mid-stream") {
				t.Errorf("first error %q, want the server's message", st.FirstError)
			}
			if row.Unfinished != st.Failed+st.Cut {
				t.Errorf("unfinished %d, want failed %d + cut %d", row.Unfinished, st.Failed, st.Cut)
			}
		})
	}
}

// TestRunAllFailedIsAnError runs against an emulated farm whose every
// request is answered 503 (warden emulate --fault error-503=1).
func TestRunAllFailedIsAnError(t *testing.T) {
	cfg := tinyConfig(emulatedWith(t, emulator.Faults{Error503: 1}))
	cfg.Sessions = []int{2}
	_, err := Run(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "all") || !strings.Contains(err.Error(), "injected by warden emulate --fault error-503") {
		t.Fatalf("err = %v, want every request failed, with the server's message", err)
	}
}

func TestRunUnreachableTarget(t *testing.T) {
	_, err := Run(context.Background(), tinyConfig(fakevllm.RefusingURL(t)))
	if err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("err = %v, want the target unreachable", err)
	}
}

func TestRunWithoutModelsEndpoint(t *testing.T) {
	f := newFakeServer(t, 1)
	f.NoModels = true
	cfg := tinyConfig(f.URL())
	cfg.Sessions = []int{1}
	if _, err := Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "--model") {
		t.Fatalf("err = %v, want a request for --model", err)
	}
	cfg.Model = f.Model
	if _, err := Run(context.Background(), cfg); err != nil {
		t.Fatalf("with --model: %v", err)
	}
}

func TestRunBadMetricsURL(t *testing.T) {
	url := emulated(t)
	cfg := tinyConfig(url)
	cfg.MetricsURLs = []string{url + "/nope"}
	if _, err := Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "/nope") {
		t.Fatalf("err = %v, want the metrics URL named", err)
	}
	cfg.MetricsURLs = nil
	cfg.ProxyMetricsURL = url + "/metrics" // vLLM's page has no warden series
	if _, err := Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "warden_later_turns_total") {
		t.Fatalf("err = %v, want the proxy's missing series named", err)
	}
}

func TestRunCancelled(t *testing.T) {
	cfg := tinyConfig(emulated(t))
	cfg.Step = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	cfg.Progress = func(done, total time.Duration) {
		if done > 0 {
			cancel()
		}
	}
	_, err := Run(ctx, cfg)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no target", func(c *Config) { c.Target = "" }, "want an http:// or https:// URL"},
		{"bad scheme", func(c *Config) { c.Target = "ftp://x" }, "want an http:// or https:// URL"},
		{"zero sessions", func(c *Config) { c.Sessions = []int{4, 0} }, "sessions 0: want 1 to"},
		{"negative sessions", func(c *Config) { c.Sessions = []int{-2} }, "sessions -2"},
		{"too many sessions", func(c *Config) { c.Sessions = []int{MaxSessions + 1} }, "want 1 to 4096"},
		{"api", func(c *Config) { c.API = "grpc" }, `api "grpc": want openai or anthropic`},
		{"speed", func(c *Config) { c.Speed = -1 }, "speed -1"},
		{"step", func(c *Config) { c.Step = -time.Second }, "step"},
		{"workload", func(c *Config) { c.Workload.Turns = 0 }, "workload: turns"},
		{"metrics url", func(c *Config) { c.MetricsURLs = []string{"localhost:9090"} }, "metrics URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tinyConfig("http://127.0.0.1:1")
			tc.edit(&cfg)
			_, err := Run(context.Background(), cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
