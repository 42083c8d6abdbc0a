// Command llmdcompare puts llm-d's endpoint picker (the EPP of
// llm-d/llm-d-router, built elsewhere and already running with file
// discovery in front of warden emulate replicas) beside warden's model of
// it, placement.NewPeer("llm-d", seed), and compares their picks turn by
// turn on the same multi-turn agent conversations. scripts/llmd-compare.sh
// starts the replicas and the EPP and runs it.
//
// It plays the gateway (Envoy's side of ext_proc, gateway.go): each turn
// of each session goes to the EPP, then to the replica it picked, and the
// answer comes back through the EPP's response phase before the session's
// next turn (which carries that answer) is sent. Sessions run side by side
// so that the replicas hold queues and KV; picks are made one at a time,
// so that each pick's log lines and index update are its own.
//
// The model is then fed the same requests with the state the EPP read
// (its per-scorer scores, logged at -v=4, give its queue and kv inputs to
// the bit; its total scores come back with --emit-endpoint-scores) and
// placed on the EPP's history (model.go follow): a disagreement is the
// model's logic or its view of the prompt. It is judged in two views of
// the prompt (model.go): the EPP's own bytes, and warden's proxy view.
// conv.go builds the conversations' request bodies, state.go reads each
// replica's vLLM gauges, compare.go records each pick (-record, -replay)
// and tallies where the two agree.
//
//	go run ./scripts/llmdcompare -epp 127.0.0.1:9002 -epp-log epp.log \
//	    -replicas 127.0.0.1:8000,127.0.0.1:8001 -names r0,r1 -record run.json
//	go run ./scripts/llmdcompare -replay run.json   # the model again, on a recorded run
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

func main() {
	if err := realMain(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "llmdcompare:", err)
		os.Exit(1)
	}
}

// config is the command line.
type config struct {
	epp, eppHealth, eppLog, eppCommit string
	replicas, names                   []string
	work                              workload
	think, gap, timeout               time.Duration
	record, replay                    string
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("llmdcompare", flag.ContinueOnError)
	fs.StringVar(&c.epp, "epp", "127.0.0.1:9002", "the EPP's ext_proc gRPC address")
	fs.StringVar(&c.eppHealth, "epp-health", "127.0.0.1:9003", "the EPP's gRPC health address (waited on until SERVING)")
	fs.StringVar(&c.eppLog, "epp-log", "", "the EPP's log (zap JSON at -v=4): its per-scorer scores give the state it read; empty: the gateway's own scrape")
	fs.StringVar(&c.eppCommit, "epp-commit", "unknown", "the llm-d-router commit the EPP was built from (for the report)")
	replicas := fs.String("replicas", "", "the replicas' host:port, comma-separated, in the order of the EPP's discovery file")
	names := fs.String("names", "", "the replicas' names in the discovery file, comma-separated (default r0, r1, ...)")
	fs.StringVar(&c.work.model, "model", "Qwen/Qwen3-4B-Instruct-2507", "the model named in the requests")
	fs.IntVar(&c.work.sessions, "sessions", 8, "agent sessions, run side by side")
	fs.IntVar(&c.work.turns, "turns", 8, "turns per session")
	fs.Uint64Var(&c.work.seed, "seed", 1, "seed of the conversations' text and of the model's tie-breaks")
	fs.IntVar(&c.work.systemBytes, "system-bytes", 3000, "bytes of the system prompt every session shares")
	fs.IntVar(&c.work.taskBytes, "task-bytes", 3000, "bytes of each session's first user message")
	fs.IntVar(&c.work.toolMinBytes, "tool-min-bytes", 400, "least bytes of a later turn's user message (a tool's output)")
	fs.IntVar(&c.work.toolMaxBytes, "tool-max-bytes", 2400, "most bytes of a later turn's user message")
	fs.IntVar(&c.work.maxTokens, "max-tokens", 64, "tokens of each answer")
	fs.DurationVar(&c.think, "think", 200*time.Millisecond, "most time a session waits between an answer and its next turn (uniform)")
	fs.DurationVar(&c.gap, "gap", 20*time.Millisecond, "time after a pick before the next (the EPP updates its prefix index asynchronously)")
	fs.DurationVar(&c.timeout, "timeout", 5*time.Minute, "the whole run's limit")
	fs.StringVar(&c.record, "record", "", "write the run (requests, picks, states) to this JSON file")
	fs.StringVar(&c.replay, "replay", "", "compare the model with a recorded run instead of running the EPP")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.replay != "" {
		return c, nil
	}
	if *replicas == "" {
		return c, errors.New("-replicas: none given")
	}
	c.replicas = strings.Split(*replicas, ",")
	if *names == "" {
		for i := range c.replicas {
			c.names = append(c.names, fmt.Sprintf("r%d", i))
		}
	} else {
		c.names = strings.Split(*names, ",")
	}
	if len(c.names) != len(c.replicas) {
		return c, fmt.Errorf("-names: %d names for %d replicas", len(c.names), len(c.replicas))
	}
	w := c.work
	if w.sessions < 1 || w.turns < 1 || w.systemBytes < 0 || w.taskBytes < 0 || w.toolMinBytes < 0 ||
		w.toolMaxBytes < w.toolMinBytes || w.maxTokens < 1 {
		return c, fmt.Errorf("the workload: sessions %d, turns %d, bytes %d/%d/%d-%d, max tokens %d: want positive counts and tool-min <= tool-max",
			w.sessions, w.turns, w.systemBytes, w.taskBytes, w.toolMinBytes, w.toolMaxBytes, w.maxTokens)
	}
	return c, nil
}

func realMain(args []string, out io.Writer) error {
	c, err := parseFlags(args)
	if err != nil {
		return err
	}
	var r *recordedRun
	if c.replay != "" {
		b, err := os.ReadFile(c.replay)
		if err != nil {
			return err
		}
		r = new(recordedRun)
		if err := json.Unmarshal(b, r); err != nil {
			return fmt.Errorf("%s: %w", c.replay, err)
		}
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		defer cancel()
		if r, err = liveRun(ctx, c); err != nil {
			return err
		}
		if c.record != "" {
			b, err := json.Marshal(r)
			if err != nil {
				return err
			}
			if err := os.WriteFile(c.record, b, 0o644); err != nil {
				return err
			}
		}
	}
	return report(out, r)
}

// liveRun runs the conversations through the EPP and returns the run.
func liveRun(ctx context.Context, c config) (*recordedRun, error) {
	hc := &http.Client{Timeout: 2 * time.Minute}
	if err := waitReplicas(ctx, hc, c.replicas); err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(c.epp, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := waitEPP(ctx, c.eppHealth, c.epp); err != nil {
		return nil, err
	}
	gw := &gateway{client: extprocv3.NewExternalProcessorClient(conn), http: hc, chunk: 16 << 10}
	r := &recordedRun{EPPCommit: c.eppCommit, Replicas: c.replicas, Model: c.work.model, Seed: c.work.seed,
		Sessions: c.work.sessions, Turns: c.work.turns}

	var (
		mu       sync.Mutex // one pick at a time
		recMu    sync.Mutex
		wg       sync.WaitGroup
		errs     = make([]error, c.work.sessions)
		sessions = c.work.conversations()
	)
	for s, conv := range sessions {
		wg.Go(func() {
			think := rand.New(rand.NewPCG(c.work.seed, 1<<32+uint64(s)))
			for t := range c.work.turns {
				if d := time.Duration(think.Int64N(int64(c.think) + 1)); d > 0 {
					select {
					case <-time.After(d):
					case <-ctx.Done():
						errs[s] = ctx.Err()
						return
					}
				}
				body := c.work.body(conv)
				rec := turnRecord{Session: conv.id, Turn: t, RequestID: fmt.Sprintf("%s-turn-%02d", conv.id, t), Body: body}
				mu.Lock()
				unlock := sync.OnceFunc(mu.Unlock)
				g, err := scrapeAll(ctx, hc, c.replicas)
				if err != nil {
					unlock()
					errs[s] = err
					return
				}
				rec.Gauges = g
				ex, err := gw.do(ctx, "/v1/chat/completions", rec.RequestID, body, func(p pick) {
					recMu.Lock()
					rec.N = len(r.Picks)
					rec.EPP = slices.Index(c.replicas, p.endpoint)
					rec.EPPScores = aligned(p.scores, c.replicas)
					r.Picks = append(r.Picks, rec)
					recMu.Unlock()
					time.Sleep(c.gap)
					unlock()
				})
				unlock()
				if err != nil {
					errs[s] = fmt.Errorf("%s: %w", rec.RequestID, err)
					return
				}
				if ex.status != http.StatusOK {
					errs[s] = fmt.Errorf("%s: the replica %s answered HTTP %d: %.300s", rec.RequestID, ex.pick.endpoint, ex.status, ex.body)
					return
				}
				answer, err := answerText(ex.body)
				if err != nil {
					errs[s] = fmt.Errorf("%s: %w", rec.RequestID, err)
					return
				}
				c.work.advance(conv, answer)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for _, t := range r.Picks {
		if t.EPP < 0 {
			return nil, fmt.Errorf("%s: the EPP picked an endpoint not in -replicas %v", t.RequestID, c.replicas)
		}
		if t.EPPScores == nil {
			return nil, fmt.Errorf("%s: the EPP gave no scores: run it with --emit-endpoint-scores", t.RequestID)
		}
	}
	return r, fillStates(r, c)
}

// fillStates sets each pick's State: from the EPP's log when it has the
// pick's scores, else the gateway's scrape.
func fillStates(r *recordedRun, c config) error {
	var parts map[string][][3]float64
	if c.eppLog != "" {
		f, err := os.Open(c.eppLog)
		if err != nil {
			return err
		}
		defer f.Close()
		if parts, err = logParts(f, c.names); err != nil {
			return err
		}
		if len(parts) == 0 {
			return fmt.Errorf("%s: no per-scorer scores (%q lines): run the EPP with -v=4", c.eppLog, msgCalculatedScore)
		}
	}
	for k := range r.Picks {
		t := &r.Picks[k]
		p, ok := parts[t.RequestID]
		if !ok {
			t.State, t.StateFrom = t.Gauges, "gateway-scrape"
			continue
		}
		st, err := stateFromParts(p, t.Gauges)
		if err != nil {
			return fmt.Errorf("%s: %w", t.RequestID, err)
		}
		t.EPPParts, t.State, t.StateFrom = p, st, "epp-log"
	}
	return nil
}

// aligned returns scores keyed by endpoint as a slice aligned with
// replicas (nil when scores is nil).
func aligned(scores map[string]float64, replicas []string) []float64 {
	if scores == nil {
		return nil
	}
	out := make([]float64, len(replicas))
	for i, a := range replicas {
		out[i] = scores[a]
	}
	return out
}

// waitReplicas waits until every replica answers /health.
func waitReplicas(ctx context.Context, c *http.Client, addrs []string) error {
	for _, a := range addrs {
		for {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a+"/health", nil)
			if err != nil {
				return err
			}
			res, err := c.Do(req)
			if err == nil {
				res.Body.Close()
				if res.StatusCode == http.StatusOK {
					break
				}
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("replica %s: not healthy: %v", a, err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

// waitEPP waits until the EPP's health service says SERVING and its
// ext_proc port (extProc) accepts connections (it starts after the health
// service), then a second more, for its first scrapes of the replicas
// (every 50 ms).
func waitEPP(ctx context.Context, addr, extProc string) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	h := healthpb.NewHealthClient(conn)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		res, err := h.Check(cctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && res.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the EPP's health at %s: not SERVING: %v", addr, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", extProc)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the EPP's ext_proc at %s: %w", extProc, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Second):
		return nil
	}
}
