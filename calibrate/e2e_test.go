package calibrate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lm-warden/warden/calibrate"
	"github.com/lm-warden/warden/emulator"
	"github.com/lm-warden/warden/metrics/promtest"
	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/planner"
	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/web"
	"github.com/lm-warden/warden/web/webtest"
)

const e2eModel = "Qwen/Qwen3-4B-Instruct-2507"

// agentClient is a closed loop of agent sessions against an OpenAI chat
// endpoint: a shared system prompt, a first message of each session's own,
// then turns that append the answer and new text, 1 token = 4 bytes of
// canonical text (the journal block model).
type agentClient struct {
	url                       string
	system, first, newPerTurn int // tokens
	turns, maxTokens          int

	mu      sync.Mutex
	prompts []int // prompt tokens of every answered request (usage)
}

func text(tag string, tokens int) string {
	var b strings.Builder
	for b.Len() < tokens*4 {
		fmt.Fprintf(&b, "%s %d. ", tag, b.Len())
	}
	return b.String()[:tokens*4]
}

// session runs one session; it returns false when ctx is done.
func (c *agentClient) session(ctx context.Context, id int) bool {
	msgs := []map[string]string{{"role": "system", "content": text("system", c.system)}, {"role": "user", "content": text(fmt.Sprintf("s%d first", id), c.first)}}
	for turn := range c.turns {
		if turn > 0 {
			msgs = append(msgs, map[string]string{"role": "user", "content": text(fmt.Sprintf("s%d t%d", id, turn), c.newPerTurn)})
		}
		body, _ := json.Marshal(map[string]any{"model": e2eModel, "messages": msgs, "max_tokens": 100 + (id*37+turn*53)%150})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		var out struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		err = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if err != nil || len(out.Choices) == 0 {
			return ctx.Err() == nil
		}
		c.mu.Lock()
		c.prompts = append(c.prompts, out.Usage.PromptTokens)
		c.mu.Unlock()
		msgs = append(msgs, map[string]string{"role": "assistant", "content": out.Choices[0].Message.Content})
	}
	return true
}

// run keeps n sessions going until ctx is done.
func (c *agentClient) run(ctx context.Context, n int) *sync.WaitGroup {
	var wg sync.WaitGroup
	for k := range n {
		wg.Go(func() {
			for s := 0; ctx.Err() == nil; s++ {
				if !c.session(ctx, k*100000+s) {
					return
				}
			}
		})
	}
	return &wg
}

// TestAgainstRealPrometheus is the must-show of calibration: a real
// Prometheus server scrapes an emulated farm (the simulator's replica
// model served over HTTP, 10 x faster than real time) whose step-time
// parameters and KV size are known, under 8 agent sessions; calibrate
// recovers the KV capacity exactly and the efficiencies within 15 %, the
// workload the concurrency and mean prompt within 15 %, and plan
// --prometheus predicts the prefix-cache hit rate of the running strategy
// within 5 points of what Prometheus observed; the report draws offline.
func TestAgainstRealPrometheus(t *testing.T) {
	if testing.Short() || os.Getenv("WARDEN_E2E") == "" {
		t.Skip("set WARDEN_E2E=1 to run a real Prometheus and an emulated farm for about 80 s")
	}
	spec := sim.FarmSpec{Model: e2eModel, GPU: "RTX A4000", Replicas: 2,
		VLLM:     sim.VLLMSpec{MaxNumSeqs: 32, NumGPUBlocks: 2500},
		StepTime: sim.StepTime{PrefillEfficiency: 0.35, BandwidthEfficiency: 0.6}}
	farm, err := sim.Resolve(spec)
	if err != nil {
		t.Fatal(err)
	}
	const speed = 10
	em, err := emulator.New(farm, emulator.Options{Layout: emulator.LayoutDP, Speed: speed, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- em.Serve(ctx, []net.Listener{ln}) }()
	t.Cleanup(func() { cancel(); <-served })

	prom := promtest.Start(t, promtest.Options{Targets: []string{ln.Addr().String()}, ScrapeInterval: time.Second})
	prom.WaitScraped(t, 1)

	const sessions = 8
	client := &agentClient{url: "http://" + ln.Addr().String(), system: 3500, first: 7300, newPerTurn: 400, turns: 6}
	start := time.Now()
	loadCtx, stopLoad := context.WithCancel(ctx)
	wg := client.run(loadCtx, sessions)
	time.Sleep(70 * time.Second) // the load runs; no assertion depends on this duration
	prom.Sync(t)
	end := time.Now()
	stopLoad()
	wg.Wait()
	// Skip the first seconds (cold caches, sessions starting together).
	w := calibrate.Window{Start: start.Add(10 * time.Second).Truncate(time.Second), End: end.Truncate(time.Second)}

	src, err := calibrate.NewPrometheus(prom.URL, 0)
	if err != nil {
		t.Fatal(err)
	}
	c, err := calibrate.Calibrate(ctx, src, calibrate.Options{Model: e2eModel, GPU: "RTX A4000", Window: w, Windows: 1,
		Base: sim.FarmSpec{VLLM: sim.VLLMSpec{MaxNumSeqs: 32}}, Fit: calibrate.FitOptions{Seed: 1}})
	if err != nil {
		t.Fatal(err)
	}
	var sum bytes.Buffer
	_ = c.WriteText(&sum)
	t.Logf("calibration:\n%s", sum.String())
	if c.NumGPUBlocks != 2500 || c.KVTokensPerReplica != 40000 {
		t.Errorf("KV: %d blocks, %d tokens; want 2500 and 40000 exactly", c.NumGPUBlocks, c.KVTokensPerReplica)
	}
	if f := c.Fit; f == nil {
		t.Error("no step-time fit")
	} else {
		if math.Abs(f.PrefillEfficiency/0.35-1) > 0.15 {
			t.Errorf("prefill_efficiency %.3f, want 0.35 within 15%%", f.PrefillEfficiency)
		}
		if math.Abs(f.BandwidthEfficiency/0.6-1) > 0.15 {
			t.Errorf("bandwidth_efficiency %.3f, want 0.6 within 15%%", f.BandwidthEfficiency)
		}
	}
	est := c.Workload
	if math.Abs(est.Sessions/sessions-1) > 0.15 {
		t.Errorf("concurrent sessions %.2f, want %d within 15%%", est.Sessions, sessions)
	}
	client.mu.Lock()
	var ps float64
	for _, p := range client.prompts {
		ps += float64(p)
	}
	truePrompt := ps / float64(len(client.prompts))
	client.mu.Unlock()
	if math.Abs(est.MeanPromptTokens/truePrompt-1) > 0.15 {
		t.Errorf("mean prompt %.0f tokens, want the client's %.0f within 15%%", est.MeanPromptTokens, truePrompt)
	}

	res, err := planner.SolveObserved(ctx, planner.Plan{Targets: planner.Targets{PrefixHitPctMin: 50}, Duration: sim.Duration(time.Minute)},
		planner.ObservedOptions{Source: src, Calibrate: calibrate.Options{Model: e2eModel, GPU: "RTX A4000", Window: w, Windows: 1,
			Base: sim.FarmSpec{VLLM: sim.VLLMSpec{MaxNumSeqs: 32}}, Workload: est, Fit: calibrate.FitOptions{Seed: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	ob := res.Observation
	if ob.Strategy != placement.StrategyLeastLoaded {
		t.Errorf("running strategy %q, want least-loaded (vLLM's own balancer)", ob.Strategy)
	}
	p, q := float64(ob.Predicted["prefix_hit_pct"]), float64(ob.Observed["prefix_hit_pct"])
	t.Logf("prefix hit %%: predicted %.1f, observed %.1f", p, q)
	if math.Abs(p-q) > 5 {
		t.Errorf("prefix hit %%: predicted %.1f, observed %.1f by Prometheus, want within 5 points", p, q)
	}
	r := web.PlanReport(res)
	path := filepath.Join(t.TempDir(), "plan.html")
	var html bytes.Buffer
	if err := r.Render(&html); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, html.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	page := webtest.CheckPage(t, "file://"+path)
	if page.Canvases != len(r.Charts()) || len(page.Console) > 0 || len(page.Blocked) > 0 {
		t.Errorf("report: %d canvases for %d charts, console %q, blocked %q", page.Canvases, len(r.Charts()), page.Console, page.Blocked)
	}
	if !strings.Contains(page.Text, "Prediction vs observation") {
		t.Error("the rendered report lacks the prediction-vs-observation section")
	}
}
