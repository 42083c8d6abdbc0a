package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"github.com/lm-warden/warden/metrics/vllm"
	"io"
	"math"
	"net/http"
	"strings"
)

// scrape reads one replica's vLLM gauges from its /metrics.
func scrape(ctx context.Context, c *http.Client, addr string) (replicaState, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return replicaState{}, err
	}
	res, err := c.Do(req)
	if err != nil {
		return replicaState{}, fmt.Errorf("scrape %s: %w", addr, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return replicaState{}, fmt.Errorf("scrape %s: HTTP %d", addr, res.StatusCode)
	}
	es, err := vllm.Parse(res.Body, vllm.MaxPageBytes)
	if err != nil {
		return replicaState{}, fmt.Errorf("scrape %s: %w", addr, err)
	}
	if len(es) != 1 {
		return replicaState{}, fmt.Errorf("scrape %s: %d engines on the page, want one", addr, len(es))
	}
	e := es[0]
	return replicaState{Waiting: int(e.Waiting), KVUsage: e.KVUsage, KVCapacityTokens: e.NumGPUBlocks * e.BlockSize}, nil
}

// scrapeAll reads every replica.
func scrapeAll(ctx context.Context, c *http.Client, addrs []string) ([]replicaState, error) {
	out := make([]replicaState, len(addrs))
	for i, a := range addrs {
		s, err := scrape(ctx, c, a)
		if err != nil {
			return nil, err
		}
		out[i] = s
	}
	return out, nil
}

// The EPP's per-scorer scores, from its log at -v=4 (zap JSON lines):
// pkg/epp/scheduling/scheduler_profile.go runScorerPlugins logs
// "Calculated score" with the plugin, the endpoint and the raw score, under
// the request's x-request-id (handlers/server.go Process).
const (
	msgCalculatedScore = "Calculated score"
	queueScorer        = "queue-scorer"
	kvScorer           = "kv-cache-utilization-scorer"
	prefixScorer       = "prefix-cache-scorer"
)

// scorerIndex is the position of a scorer in the [3]float64 parts.
func scorerIndex(plugin string) int {
	switch {
	case strings.Contains(plugin, kvScorer):
		return 1
	case strings.Contains(plugin, prefixScorer):
		return 2
	case strings.Contains(plugin, queueScorer):
		return 0
	}
	return -1
}

// logParts reads the EPP's log and returns, per request id, the scores of
// the three scorers for each endpoint, aligned with names (the endpoints'
// names in the discovery file; the log names an endpoint
// "namespace/name"). A request whose scores are incomplete is left out.
func logParts(r io.Reader, names []string) (map[string][][3]float64, error) {
	index := make(map[string]int, len(names))
	for i, n := range names {
		index[n] = i
	}
	type partial struct {
		parts [][3]float64
		seen  [][3]bool
	}
	got := map[string]*partial{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !strings.Contains(string(line), msgCalculatedScore) {
			continue
		}
		var v struct {
			Msg       string          `json:"msg"`
			RequestID string          `json:"x-request-id"`
			Plugin    json.RawMessage `json:"plugin"`
			Endpoint  json.RawMessage `json:"endpoint"`
			Score     *float64        `json:"score"`
		}
		if json.Unmarshal(line, &v) != nil || v.Msg != msgCalculatedScore || v.Score == nil || v.RequestID == "" {
			continue
		}
		s := scorerIndex(string(v.Plugin))
		ep := endpointName(v.Endpoint)
		i, ok := index[ep]
		if s < 0 || !ok {
			return nil, fmt.Errorf("the EPP's log: a score of plugin %s for endpoint %s, not one of %v", v.Plugin, v.Endpoint, names)
		}
		p := got[v.RequestID]
		if p == nil {
			p = &partial{parts: make([][3]float64, len(names)), seen: make([][3]bool, len(names))}
			got[v.RequestID] = p
		}
		p.parts[i][s] = *v.Score
		p.seen[i][s] = true
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("the EPP's log: %w", err)
	}
	out := make(map[string][][3]float64, len(got))
	for id, p := range got {
		full := true
		for _, s := range p.seen {
			full = full && s[0] && s[1] && s[2]
		}
		if full {
			out[id] = p.parts
		}
	}
	return out, nil
}

// endpointName is the name part of a logged endpoint id: "ns/name" as a
// string, or a {"Namespace", "Name"} object.
func endpointName(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if i := strings.LastIndexByte(s, '/'); i >= 0 {
			return s[i+1:]
		}
		return s
	}
	var o struct{ Name string }
	if json.Unmarshal(raw, &o) == nil {
		return o.Name
	}
	return ""
}

// stateFromParts returns the gauges the EPP read, given its queue and kv
// scores, so that the model's scores of them are the EPP's to the bit:
// KVUsage u with 1 - u == the kv score (kvcacheutilization: 1 - usage),
// and waiting counts w with (max - w) / (max - min) == the queue score
// (queuedepth/queue.go). The gateway's own scrape near the pick (gauges)
// is taken where it gives those scores; otherwise the usage is 1 - score
// and the counts are the smallest integers giving the scores (only the
// differences between replicas matter to the scorer). gauges carries each
// replica's KV capacity. It fails when no counts up to 4096 give the
// queue scores.
func stateFromParts(parts [][3]float64, gauges []replicaState) ([]replicaState, error) {
	out := make([]replicaState, len(parts))
	for i, p := range parts {
		out[i].KVCapacityTokens = gauges[i].KVCapacityTokens
		u := gauges[i].KVUsage
		if 1-u != p[1] {
			u = 1 - p[1]
			for k := 0; 1-u != p[1] && k < 4; k++ {
				if 1-u < p[1] {
					u = math.Nextafter(u, math.Inf(-1))
				} else {
					u = math.Nextafter(u, math.Inf(1))
				}
			}
		}
		if 1-u != p[1] {
			return nil, fmt.Errorf("replica %d: no usage gives the kv score %v", i, p[1])
		}
		out[i].KVUsage = u
	}
	waiting := make([]int, len(parts))
	for i := range parts {
		waiting[i] = gauges[i].Waiting
	}
	if queueScoresAre(waiting, parts) {
		for i := range out {
			out[i].Waiting = waiting[i]
		}
		return out, nil
	}
	for d := 1; d <= 4096; d++ {
		for i, p := range parts {
			waiting[i] = int(math.Round(float64(d) * (1 - p[0])))
		}
		if queueScoresAre(waiting, parts) {
			for i := range out {
				out[i].Waiting = waiting[i]
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("no waiting counts up to 4096 give the queue scores %v", parts)
}

// queueScoresAre reports whether the queue scorer gives waiting the
// scores parts[i][0] (queuedepth/queue.go: 1 when all are equal, else
// (max - w) / (max - min)).
func queueScoresAre(waiting []int, parts [][3]float64) bool {
	lo, hi := math.MaxInt, math.MinInt
	for _, w := range waiting {
		lo, hi = min(lo, w), max(hi, w)
	}
	for i, w := range waiting {
		s := 1.0
		if hi != lo {
			s = float64(hi-w) / float64(hi-lo)
		}
		if s != parts[i][0] {
			return false
		}
	}
	return true
}
