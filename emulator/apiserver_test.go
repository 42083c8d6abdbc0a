package emulator

import (
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestAPIServerWorksOnOneRequestAtATime: three one-token requests sent at
// once to a server whose API server takes 1 s of model time a request
// (0.1 s of wall time at speed 10) are answered one behind the other, the
// k-th no sooner than k x 0.1 s, as vLLM's server tokenises one at a time;
// before, all three were answered within a prefill. Both layouts: a
// replica's own server, and a data-parallel server of two engines with
// api_server_count 1. Only lower bounds: a slow machine answers later,
// never sooner.
func TestAPIServerWorksOnOneRequestAtATime(t *testing.T) {
	for _, tc := range []struct {
		name   string
		layout Layout
		farm   string
	}{
		{"one replica", LayoutURLs, ""},
		{"data parallel", LayoutDP, ", api_server_count: 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			replicas := 1
			if tc.layout == LayoutDP {
				replicas = 2
			}
			r := start(t, testFarm(t, replicas, tc.farm), Options{Layout: tc.layout, Speed: 10, APIServerTime: time.Second, APIServerPerKToken: -1})
			const n = 3
			began := time.Now()
			took := make([]time.Duration, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					code, body := post(t, r.urls[0]+"/v1/chat/completions", chatBody("", []string{fmt.Sprintf("question %d", i)}, nil, 1, false))
					if code != http.StatusOK {
						t.Errorf("status %d: %s", code, body)
					}
					took[i] = time.Since(began)
				})
			}
			wg.Wait()
			slices.Sort(took)
			for k, d := range took {
				if want := time.Duration(k+1) * 100 * time.Millisecond; d < want {
					t.Errorf("answers after %v, want the k-th no sooner than k x 100ms", took)
					break
				}
			}
		})
	}
}
