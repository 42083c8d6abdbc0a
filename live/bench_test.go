package live

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/placement"
)

// BenchmarkAddedLatency measures what the proxy adds to a request: each
// iteration sends one request straight to a backend and one through the
// proxy, paced at 1,000 requests/s, and reports the percentiles of both and
// of their difference. The backend reads the body and answers a small JSON.
//
//	go test -run '^$' -bench AddedLatency -benchtime 2000x ./live/
func BenchmarkAddedLatency(b *testing.B) {
	for _, size := range []int{64 << 10, 256 << 10} {
		b.Run(strconv.Itoa(size>>10)+"KB", func(b *testing.B) {
			backend := benchBackend()
			defer backend.Close()
			h := startProxy(b, modelsYAML("limits: {max_body_bytes: 1MiB}\n", urlsModel(backend.URL)))
			body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]}`, testModel, strings.Repeat("x", size-60))
			send := func(url string, session int) time.Duration {
				return postTimed(b, h.client, url, body, "session-id", "bench-"+strconv.Itoa(session%64))
			}
			send(backend.URL, 0) // warm both connection pools
			send(h.url, 0)
			var direct, proxied []time.Duration
			tick := time.NewTicker(time.Millisecond) // 1,000 requests/s
			defer tick.Stop()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				<-tick.C
				direct = append(direct, send(backend.URL, i))
				proxied = append(proxied, send(h.url, i))
				i++
			}
			pct := pctMicros
			b.ReportMetric(pct(direct, 0.5), "direct-p50-µs")
			b.ReportMetric(pct(direct, 0.99), "direct-p99-µs")
			b.ReportMetric(pct(proxied, 0.5), "proxy-p50-µs")
			b.ReportMetric(pct(proxied, 0.99), "proxy-p99-µs")
			b.ReportMetric(pct(proxied, 0.5)-pct(direct, 0.5), "added-p50-µs")
			b.ReportMetric(pct(proxied, 0.99)-pct(direct, 0.99), "added-p99-µs")
		})
	}
}

// BenchmarkSessionMemory places 1M sessions through a model's pick path
// (keyed session hashes, affinity policy) and reports the heap they hold.
//
//	go test -run '^$' -bench SessionMemory -benchtime 1x ./live/
func BenchmarkSessionMemory(b *testing.B) {
	const n = 1_000_000
	keyer := NewKeyer([]byte("k"))
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		cfg := ModelCfg{Name: "m", Replicas: []string{"http://a:1", "http://b:1", "http://c:1", "http://d:1"},
			SpillThreshold: Spill{Auto: true}, SessionTTL: Duration(time.Hour), MaxSessions: n}
		m, err := newModel(cfg, http.DefaultClient, time.Second, time.Second)
		if err != nil {
			b.Fatal(err)
		}
		now := time.Now()
		for i := range n {
			r := placement.Request{Session: keyer.Sum("session-" + strconv.Itoa(i)), Model: "m", Pinned: placement.NoPin}
			p, err := m.pick(&r, -1, now)
			if err != nil {
				b.Fatal(err)
			}
			p.rep.inFlight.Add(-1)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if got := m.table.Len(); got != n {
			b.Fatalf("table holds %d sessions, want %d", got, n)
		}
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "bytes/session")
		runtime.KeepAlive(m)
	}
}

// BenchmarkPick is one placement on the request path (model.pick): the
// snapshot built from fresh scrapes of 8 one-engine servers, then Pick.
func BenchmarkPick(b *testing.B) {
	cfg := ModelCfg{Name: "m", SpillThreshold: Spill{Auto: true}, SessionTTL: Duration(time.Hour), MaxSessions: 1 << 20}
	for range 8 {
		cfg.Replicas = append(cfg.Replicas, "http://a:1")
	}
	m, err := newModel(cfg, http.DefaultClient, time.Second, time.Second)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	for _, s := range m.servers {
		s.last.Store(&ScrapeResult{Seq: 1, OK: now, Healthy: true, Engines: []EngineStats{{Running: 3, Waiting: 1, KVUsage: 0.5}}})
	}
	r := placement.Request{Session: "s", Model: "m", Pinned: placement.NoPin}
	b.ReportAllocs()
	for b.Loop() {
		p, err := m.pick(&r, -1, now)
		if err != nil {
			b.Fatal(err)
		}
		p.rep.inFlight.Add(-1)
	}
}

// benchBackend is a backend that reads the body and answers a small JSON
// (and empty /metrics and /health pages).
func benchBackend() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" || r.URL.Path == "/health" {
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"ok"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}))
}

// postTimed posts body to url's /v1/chat/completions with the test key and
// the session in header hdr, fails b unless it gets 200, and returns the
// time to the end of the answer.
func postTimed(b *testing.B, c *http.Client, url, body, hdr, session string) time.Duration {
	req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(hdr, session)
	start := time.Now()
	res, err := c.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != 200 {
		b.Fatalf("status %d", res.StatusCode)
	}
	return time.Since(start)
}

// pctMicros is the p-quantile of d (nearest rank) in microseconds.
func pctMicros(d []time.Duration, p float64) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[min(len(s)-1, int(p*float64(len(s))))].Microseconds())
}
