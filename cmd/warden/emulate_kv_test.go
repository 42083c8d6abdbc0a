package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestEmulateKVEventsFlag: --kv-events FORM, for each of vLLM's forms,
// opens a PUB and a replay socket per replica and prints them; a bad form
// is refused naming the flag.
func TestEmulateKVEventsFlag(t *testing.T) {
	for _, form := range []string{"array", "map", "batch-map"} {
		ctx, cancel := context.WithCancel(context.Background())
		ready := make(chan struct{}, 1)
		var out bytes.Buffer
		opts := &emulateOptions{Listen: "127.0.0.1:0", Layout: "urls", Speed: 100, Seed: 1,
			KVEvents: form, KVEndpoint: "tcp://127.0.0.1:0", KVReplay: "tcp://127.0.0.1:0",
			ready: func([]string) { ready <- struct{}{} }}
		done := make(chan error, 1)
		go func() { done <- runEmulate(ctx, opts, &out) }()
		select {
		case <-ready:
		case err := <-done:
			t.Fatalf("runEmulate: %v", err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("runEmulate: %v", err)
		}
		if n := strings.Count(out.String(), "kv events ("+form+")  tcp://127.0.0.1:"); n != 4 {
			t.Errorf("%d replicas print their KV events sockets, want 4:\n%s", n, out.String())
		}
	}
	var out bytes.Buffer
	bad := &emulateOptions{Listen: "127.0.0.1:0", Layout: "urls", Speed: 1, KVEvents: "json"}
	if err := runEmulate(context.Background(), bad, &out); err == nil || !strings.Contains(err.Error(), `--kv-events: kv events form "json"`) {
		t.Errorf("--kv-events json: %v", err)
	}
}
