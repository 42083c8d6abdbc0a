package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/lm-warden/warden/emulator"
	"github.com/lm-warden/warden/examples"
	"github.com/lm-warden/warden/kvevents"
	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/traces"
)

// emulateOptions are the flags of `warden emulate`.
type emulateOptions struct {
	Farm   string
	Listen string
	Layout string
	Speed  float64
	Seed   uint64
	Fault  string
	// KVEvents is the KV events' wire form (array or map), "" for none;
	// KVEndpoint and KVReplay are rank 0's sockets (rank k: port + k).
	KVEvents   string
	KVEndpoint string
	KVReplay   string
	// APIServerTime and APIServerPerK are vLLM's API server's work on a
	// request (0: none).
	APIServerTime time.Duration
	APIServerPerK time.Duration

	// ready, when set, is called once every listener is open (tests).
	ready func(urls []string)
}

func newEmulateCmd() *cobra.Command {
	opts := &emulateOptions{}
	cmd := &cobra.Command{
		Use:   "emulate",
		Short: "Serve an emulated vLLM farm (the simulator's replica model) over HTTP, without GPUs",
		Long: `Serve a farm's replicas in wall time with the simulator's replica model: the
same scheduler, KV block pool, prefix cache and step time as warden sim. Each
replica speaks vLLM's OpenAI (/v1/chat/completions, /v1/completions, the
Responses API /v1/responses) and Anthropic (/v1/messages) APIs, streamed or not, and exposes /metrics (vLLM's
series, engine label per replica), /health and /v1/models.

Layouts: urls serves replica k on the listen port + k (one URL per replica, as
vLLM with --data-parallel-rank k); dp serves all replicas on one port, a request
picking its rank with X-data-parallel-rank or else vLLM's own balancer.

Prompts become blocks by the canonical-text rule (4 bytes of text per token,
16-token blocks hashed in a chain), so equal prefixes hit; each answer is
max_tokens tokens (default 256) of deterministic text, which a following turn
that carries it hits too. usage.prompt_tokens_details.cached_tokens is returned.
--speed 10 runs the model ten times faster than the wall clock; /metrics
histograms record model time.

--fault injects what production does to a proxy, per inference request and
deterministically from --seed (the n-th request of a replica draws the same
faults every run): stall-after-headers=P sends the headers, then nothing
(/health stays OK); error-503=P answers 503 in vLLM's error shape;
die-mid-stream=P closes the connection halfway through the answer;
slow-metrics=D delays every /metrics answer by D. P is a probability in
[0, 1]. To make one replica of several faulty, run a second warden emulate
with --fault on other ports.

--kv-events FORM makes each replica publish vLLM's KV-cache events over ZeroMQ
as vLLM's --kv-events-config does: batches of BlockStored / BlockRemoved in
msgpack, byte for byte as msgspec writes vLLM's structs in each release's form:
array (before vLLM PR #42892: the batch and its events positional, every field
written), map (PR #42892, vLLM 0.26: the events tagged maps, the batch
positional) or batch-map (vLLM main: the batch a map too). Replica k publishes
on --kv-events-endpoint's port + k and answers replay requests on
--kv-events-replay's port + k. warden proxy reads every form with kv_events in
its model config.`,
		Example: `  warden emulate                                   # the built-in 4 x RTX A4000 farm on ports 8000-8003
  warden emulate --farm examples/a4000-qwen3-4b.yaml --layout dp --speed 10
  curl -s localhost:8000/v1/chat/completions -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":8}'
  curl -sN localhost:8000/v1/responses -d '{"input":"hi","max_output_tokens":8,"stream":true}'
  warden emulate --fault stall-after-headers=0.1,error-503=0.05,slow-metrics=3s
  warden emulate --kv-events map --kv-events-endpoint tcp://127.0.0.1:5557
  warden emulate --kv-events batch-map --kv-events-replay ""`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runEmulate(cmd.Context(), opts, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Farm, "farm", "", "farm spec YAML (default: the built-in 4 x RTX A4000 example)")
	f.StringVar(&opts.Listen, "listen", "127.0.0.1:8000", "address of the first replica (urls: replica k on port+k; dp: the one server)")
	f.StringVar(&opts.Layout, "layout", "urls", "urls (one port per replica) or dp (one server, X-data-parallel-rank)")
	f.Float64Var(&opts.Speed, "speed", 1, "time factor: the model runs this many times faster than the wall clock")
	f.Uint64Var(&opts.Seed, "seed", 1, "seed of the answers' text and of the faults' draws")
	def := traces.DefaultWorkload()
	f.DurationVar(&opts.APIServerTime, "api-server-time", def.APIServerTime, "vLLM's API server's work on a request before its engine sees it (templating, tokenising), one request at a time; 0: none")
	f.DurationVar(&opts.APIServerPerK, "api-server-per-1k-tokens", def.APIServerPerKToken, "the API server's further work per 1,000 prompt tokens")
	f.StringVar(&opts.Fault, "fault", "", "faults to inject: stall-after-headers=P,error-503=P,die-mid-stream=P (probabilities), slow-metrics=D (a duration)")
	f.StringVar(&opts.KVEvents, "kv-events", "", "publish vLLM's KV-cache events in this wire form: array (vLLM before PR #42892), map (PR #42892, vLLM 0.26) or batch-map (vLLM main); empty: none")
	f.StringVar(&opts.KVEndpoint, "kv-events-endpoint", "tcp://127.0.0.1:5557", "KV events PUB socket of replica 0 (replica k: port + k)")
	f.StringVar(&opts.KVReplay, "kv-events-replay", "tcp://127.0.0.1:5657", "KV events replay (ROUTER) socket of replica 0 (replica k: port + k); empty: none")
	return cmd
}

// runEmulate serves the emulated farm until ctx is done.
func runEmulate(ctx context.Context, opts *emulateOptions, out io.Writer) error {
	// The emulator reads a zero speed as "the default, 1": given on the
	// command line it is a mistake (time standing still), not a default.
	if !(opts.Speed >= 1e-3) || opts.Speed > 1e6 {
		return fmt.Errorf("--speed %g: want a time factor from 0.001 to 1e6 (1: the wall clock; 10: ten times faster)", opts.Speed)
	}
	layout, err := emulator.ParseLayout(opts.Layout)
	if err != nil {
		return fmt.Errorf("--layout: %w", err)
	}
	data, name := examples.Default, examples.DefaultName
	if opts.Farm != "" {
		if data, err = os.ReadFile(opts.Farm); err != nil {
			return err
		}
		name = opts.Farm
	}
	farm, err := sim.ParseFarm(data, name)
	if err != nil {
		return err
	}
	faults, err := emulator.ParseFaults(opts.Fault)
	if err != nil {
		return fmt.Errorf("--fault: %w", err)
	}
	var kv emulator.KVEventsOptions
	if opts.KVEvents != "" {
		if kv.Form, err = kvevents.ParseForm(opts.KVEvents); err != nil {
			return fmt.Errorf("--kv-events: %w", err)
		}
		kv.Endpoint, kv.ReplayEndpoint = opts.KVEndpoint, opts.KVReplay
	}
	api := [2]time.Duration{opts.APIServerTime, opts.APIServerPerK}
	for i, flag := range []string{"--api-server-time", "--api-server-per-1k-tokens"} {
		switch {
		case api[i] < 0 || api[i] > time.Minute:
			return fmt.Errorf("%s %s: want a duration in [0s, 1m]", flag, api[i])
		case api[i] == 0:
			api[i] = -1 // none (emulator.Options: 0 is the default)
		}
	}
	e, err := emulator.New(farm, emulator.Options{Layout: layout, Speed: opts.Speed, Seed: opts.Seed, Faults: faults,
		APIServerTime: api[0], APIServerPerKToken: api[1], KVEvents: kv})
	if err != nil {
		return err
	}
	lns, err := listen(opts.Listen, e.Listeners())
	if err != nil {
		return err
	}
	urls := make([]string, len(lns))
	for i, ln := range lns {
		urls[i] = "http://" + ln.Addr().String()
	}
	fmt.Fprintf(out, "warden emulate: %s, %d replica(s) of %s, max_model_len %d, speed x%g, layout %s\n",
		farm.Name(), e.Replicas(), e.Model(), e.MaxModelLen(), opts.Speed, layout)
	for i, u := range urls {
		if layout == emulator.LayoutDP {
			fmt.Fprintf(out, "  %s  ranks 0-%d (header %s)\n", u, e.Replicas()-1, emulator.RankHeader)
			break
		}
		fmt.Fprintf(out, "  replica %d  %s\n", i, u)
	}
	if pubs, replays := e.KVEndpoints(); pubs != nil {
		for i := range pubs {
			fmt.Fprintf(out, "  replica %d kv events (%s)  %s  replay %s\n", i, kv.Form, pubs[i], replays[i])
		}
	}
	if f := faults.String(); f != "" {
		fmt.Fprintf(out, "  faults: %s (seed %d)\n", f, opts.Seed)
	}
	if opts.ready != nil {
		opts.ready(urls)
	}
	return e.Serve(ctx, lns)
}

// listen opens n listeners: addr, then the following ports. Port 0 gives
// n ports chosen by the system.
func listen(addr string, n int) ([]net.Listener, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("--listen %q: %w", addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port+n-1 > 65535 {
		return nil, fmt.Errorf("--listen %q: want host:port with room for %d port(s)", addr, n)
	}
	var lns []net.Listener
	for i := range n {
		p := 0
		if port > 0 {
			p = port + i
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return nil, fmt.Errorf("--listen: %w", err)
		}
		lns = append(lns, ln)
	}
	return lns, nil
}
