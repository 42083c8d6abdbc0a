package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestEmulateServesAndStops(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, layout := range []string{"urls", "dp"} {
		t.Run(layout, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			urlc := make(chan []string, 1)
			var out bytes.Buffer
			opts := &emulateOptions{Listen: "127.0.0.1:0", Layout: layout, Speed: 100, Seed: 1,
				ready: func(urls []string) { urlc <- urls }}
			done := make(chan error, 1)
			go func() { done <- runEmulate(ctx, opts, &out) }()
			var urls []string
			select {
			case urls = <-urlc:
			case err := <-done:
				t.Fatalf("runEmulate: %v", err)
			}
			want := map[string]int{"urls": 4, "dp": 1}[layout]
			if len(urls) != want {
				t.Fatalf("%d URLs, want %d", len(urls), want)
			}
			client := &http.Client{Timeout: 20 * time.Second}
			resp, err := client.Post(urls[len(urls)-1]+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"messages":[{"role":"user","content":"hello"}],"max_tokens":5}`))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var v struct {
				Usage struct {
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			}
			if resp.StatusCode != 200 || json.Unmarshal(body, &v) != nil || v.Usage.CompletionTokens != 5 {
				t.Errorf("chat: %d %s", resp.StatusCode, body)
			}
			client.CloseIdleConnections()
			cancel()
			if err := <-done; err != nil {
				t.Errorf("runEmulate after cancel: %v", err)
			}
			for _, u := range urls {
				if !strings.Contains(out.String(), u) {
					t.Errorf("output does not name %s:\n%s", u, out.String())
				}
			}
		})
	}
}

func TestEmulateBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--layout", "ring"}, "--layout"},
		{[]string{"--listen", "nowhere"}, "--listen"},
		{[]string{"--farm", "does-not-exist.yaml"}, "does-not-exist.yaml"},
		{[]string{"--speed", "-2"}, "speed"},
		{[]string{"--speed", "0"}, "--speed 0: want a time factor from 0.001 to 1e6"}, // was served at speed 1
		{[]string{"--speed", "NaN"}, "--speed NaN: want a time factor"},
		{[]string{"--fault", "error-503=0.1,stall=1"}, `--fault: item 2 "stall=1": unknown fault`},
		{[]string{"--api-server-time", "-1ms"}, "--api-server-time -1ms: want a duration in [0s, 1m]"},
		{[]string{"--api-server-per-1k-tokens", "2m"}, "--api-server-per-1k-tokens 2m0s: want a duration in [0s, 1m]"},
		{[]string{"--fault", "die-mid-stream=2"}, `--fault: item 1 "die-mid-stream=2": die-mid-stream wants a probability in [0, 1]`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			root := newRootCmd()
			var out, errb bytes.Buffer
			root.SetOut(&out)
			root.SetErr(&errb)
			root.SetArgs(append([]string{"emulate", "--listen", "127.0.0.1:0"}, tc.args...))
			err := root.ExecuteContext(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one naming %q", err, tc.want)
			}
		})
	}
}
