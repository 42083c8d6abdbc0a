package live

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// A replica under load may miss one health probe's deadline: it is marked
// down only at the healthFall-th failed probe in a row (HAProxy's "fall 3"),
// while a refused connection (the server is gone) and a failure before any
// good probe mark it down at once. One slow /health used to take a loaded
// replica out, and with every replica loaded the whole model answered 503.
func TestHealthNeedsConsecutiveFailures(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string // per probe: o = 200, s = slower than the timeout, e = 500, x = server closed
		want   string // per probe: H healthy, D down
	}{
		{"one slow probe", "oso", "HHH"},
		{"two slow probes", "ossoo", "HHHHH"},
		{"three slow probes", "osssoo", "HHHDHH"},
		{"error statuses", "oeeeo", "HHHDH"},
		{"mixed failures in a row", "oseso", "HHHDH"},
		{"failures apart", "osososos", "HHHHHHHH"},
		{"first probe fails", "eo", "DH"},
		{"server gone", "ox", "HD"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var step atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/health" {
					return // /metrics: an empty page
				}
				switch tc.script[step.Load()] {
				case 's':
					select {
					case <-r.Context().Done():
					case <-time.After(2 * time.Second):
					}
				case 'e':
					w.WriteHeader(http.StatusInternalServerError)
				}
			}))
			defer srv.Close()
			client := &http.Client{Transport: &http.Transport{}}
			defer client.CloseIdleConnections()
			s := newScraper(srv.URL, client, time.Second, 100*time.Millisecond)
			got := ""
			for i := range tc.script {
				step.Store(int32(i))
				if tc.script[i] == 'x' {
					srv.CloseClientConnections()
					srv.Listener.Close()
					client.CloseIdleConnections()
				}
				s.scrapeOnce(t.Context())
				if s.last.Load().Healthy {
					got += "H"
				} else {
					got += "D"
				}
				if down := s.downCtx().Err() != nil; down == s.last.Load().Healthy {
					t.Fatalf("probe %d: healthy %v but the down signal says %v", i, s.last.Load().Healthy, down)
				}
			}
			if got != tc.want {
				t.Errorf("script %s: got %s, want %s", tc.script, got, tc.want)
			}
		})
	}
}
