package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lm-warden/warden/live"
)

// readmeStatus is the proxy status URL the README's `warden check
// --status` uses.
const readmeStatus = "http://127.0.0.1:9091/api/status"

var kvLineRE = regexp.MustCompile(`kv events \(map\)  (tcp://\S+)  replay (tcp://\S+)`)

// serveProxyStatus runs, until the test ends, what the README's
// `warden check --status` line reads in production: `warden emulate`
// (the example A4000 farm, publishing vLLM's KV events in the map form)
// behind `warden proxy` following those events. Two conversations of two
// turns each pass through the proxy; it returns the proxy's /api/status
// URL once every replica that served holds blocks by its events.
func serveProxyStatus(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait(); http.DefaultClient.CloseIdleConnections() })

	urlc := make(chan []string, 1)
	var emOut bytes.Buffer
	em := &emulateOptions{Listen: "127.0.0.1:0", Layout: "urls", Speed: 20, Seed: 1, Farm: "examples/a4000-qwen3-4b.yaml",
		KVEvents: "map", KVEndpoint: "tcp://127.0.0.1:0", KVReplay: "tcp://127.0.0.1:0", ready: func(u []string) { urlc <- u }}
	emErr := make(chan error, 1)
	wg.Go(func() { emErr <- runEmulate(ctx, em, &emOut) })
	var urls []string
	select {
	case urls = <-urlc:
	case err := <-emErr:
		t.Fatalf("emulate: %v", err)
	}
	var pubs, replays []string
	for _, m := range kvLineRE.FindAllStringSubmatch(emOut.String(), -1) {
		pubs, replays = append(pubs, m[1]), append(replays, m[2])
	}
	if len(pubs) != len(urls) {
		t.Fatalf("emulate printed %d KV event sockets for %d replicas:\n%s", len(pubs), len(urls), emOut.String())
	}
	const model = "Qwen/Qwen3-4B-Instruct-2507"
	cfg := filepath.Join(t.TempDir(), "proxy-kv.yaml")
	yaml := fmt.Sprintf("listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nauth: passthrough\nscrape_interval: 50ms\nmodels:\n"+
		"  - name: %s\n    replicas: [%s]\n    max_num_seqs: 32\n    kv_events:\n      endpoints: [%s]\n      replay_endpoints: [%s]\n",
		model, strings.Join(urls, ", "), strings.Join(pubs, ", "), strings.Join(replays, ", "))
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	target, metrics := startLoopProxy(ctx, t, &wg, cfg)
	status := strings.TrimSuffix(metrics, "/metrics") + "/api/status"

	system := strings.Repeat("You are a careful coding agent working in a Go repository. ", 40)
	for turn := range 2 {
		for _, s := range []string{"readme-a", "readme-b"} {
			body := fmt.Sprintf(`{"model":%q,"max_tokens":16,"messages":[{"role":"system","content":%q},{"role":"user","content":"turn %d of %s"}]}`,
				model, system, turn, s)
			req, err := http.NewRequestWithContext(ctx, "POST", target+"/v1/chat/completions", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Session-Id", s)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("turn %d of %s: %s", turn, s, resp.Status)
			}
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if held, err := replicasHolding(ctx, status); err == nil && held {
			return status
		} else if time.Now().After(deadline) {
			t.Fatalf("no replica that served holds blocks by its KV events after 20 s (%v)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// replicasHolding reports whether every replica that served a request
// holds blocks by its KV events, and at least one served.
func replicasHolding(ctx context.Context, url string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return false, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	var st live.StatusReport
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return false, err
	}
	served := 0
	for _, m := range st.Models {
		for _, r := range m.Replicas {
			if r.Requests == 0 {
				continue
			}
			served++
			if r.KVEvents == nil || r.KVEvents.BlocksHeld == 0 {
				return false, nil
			}
		}
	}
	return served > 0, nil
}
