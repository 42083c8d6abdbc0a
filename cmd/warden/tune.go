package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/lm-warden/warden/internal/num"
	"github.com/lm-warden/warden/live"
	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/planner"
	"github.com/lm-warden/warden/sim"
)

// tuneOptions are the flags of `warden tune`.
type tuneOptions struct {
	Journals []string
	Farm     string
	Model    string
	Variants []string
	Seed     uint64
	JSON     bool
}

// defaultTuneVariants are the routings `warden tune` compares: the
// strategies the proxy serves (the registry's), then affinity's options
// one by one and combined. Admission is tried at three timeouts around the
// proxy's default (30 s); priced runs in the proxy with
// prefill_tokens_per_s: metrics (each replica's rate measured from vLLM's
// prefill-time histogram).
var defaultTuneVariants = append(placement.ProxyStrategies(),
	"affinity+kv",
	"affinity+admit=10s", "affinity+admit=30s", "affinity+admit=60s",
	"affinity+kv+admit=10s", "affinity+kv+admit=30s", "affinity+kv+admit=60s",
	"affinity+priced", "affinity+kv+priced+admit=30s",
)

func newTuneCmd() *cobra.Command {
	opts := &tuneOptions{}
	cmd := &cobra.Command{
		Use:   "tune",
		Short: "Replay the proxy's journal through each routing variant and recommend the proxy's routing keys",
		Long: `Replay the proxy's request journal (journal: in its config) on a farm, once per
routing variant, and print each variant's prefix hit %, TTFB p50 and p95 (as the
client sees it: an admission wait counts), output tokens per minute and, with
admission, the requests that waited for KV headroom, those refused after the
timeout (429/529) and those of them the client sent again. Then it prints the
recommended routing as the keys of the model's entry under models: in the
proxy config, checked by the proxy's own config loader.

The replay keeps the journal's sessions, prompt sizes, block hashes (equal
prefixes hit as equal prefixes) and think times, and when each session began:
a session starts at its first request's recorded arrival, and each later turn
is sent when the previous answer has reached the client plus its recorded
think time, as an agent sends it (warden sim --trace FILE --session-replay),
so a slower routing delays the later turns rather than piling them up. As
in the proxy, the router learns when each request is sent and when it ends,
never that a conversation ended: a conversation holds KV headroom while a
request of it runs and, after, for its return timeout (the gaps it left
between its turns, smoothed as TCP times a retransmission: at least 1 s, at
most active_window), then admission counts its room free. A first turn
refused after the admission timeout is sent again after the proxy's
Retry-After (5 s), at most twice, as the Anthropic and OpenAI SDKs do by
default (max_retries 2); refused a third time, its session ends.

--journal takes a file, several (repeat the flag or separate by commas), a
glob ("journal.jsonl*", quoted or not) or a directory (every file in it). The
proxy rotates its journal to FILE.1, FILE.2, ... (FILE.1 the newest rotated,
FILE the current one): files are replayed oldest first, FILE.N before FILE.N-1
before FILE, each file's times following on from the previous file's last
arrival (the gap between files is not recorded; a restart's is dropped).

The journal must be for one model: with requests for several, --model picks
one. When the model's name is in the hardware catalogue it must be the farm's
model; a name the catalogue does not know (a served alias) is taken to be the
farm's model, and tune says so.

Each variant runs on its own copy of the farm from cold caches. Unnamed
options take the proxy's defaults, not the farm file's routing block:
balance sessions, admission off, admission_timeout 30s (the proxy's default;
affinity+admit=10s names another). The farm's spill_threshold (when auto or
a number), session_ttl and active_window are kept, and printed in the
routing block. least-loaded is the proxy's own (routing.balancer: warden),
since every row is a proxy configuration.

Variants (--variants): hash, least-loaded, affinity, and affinity with
options kv, priced, admit or admit=TIMEOUT, rehome joined by "+", as warden sim
--strategies takes them. The default list is the three strategies, kv,
admit and kv+admit at 10s, 30s and 60s, priced and kv+priced+admit.

The peers' routers (` + strings.Join(placement.PeerNames(), ", ") + `) replay
too, for comparison; the proxy does not serve them, so they are never the
reference or the recommendation.

The recommendation is ` + planner.TuneRule + `

The same seed gives byte-identical output.`,
		Example: `  warden tune --journal /var/log/warden/journal.jsonl --farm examples/a4000-qwen3-4b.yaml
  warden tune --journal 'journal.jsonl*' --farm farm.yaml --model Qwen/Qwen3-4B-Instruct-2507 --json
  warden tune --journal journal.jsonl --farm farm.yaml --variants least-loaded,affinity,affinity+kv+admit=20s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runTune(cmd.Context(), opts, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&opts.Journals, "journal", nil, "the proxy's journal: files, globs or a directory (rotated files FILE.N are replayed oldest first)")
	f.StringVar(&opts.Farm, "farm", "", "farm spec YAML the journal is replayed on")
	f.StringVar(&opts.Model, "model", "", "replay only the journal's requests for this model (needed when it has several)")
	f.StringSliceVar(&opts.Variants, "variants", defaultTuneVariants, "routing variants to compare: "+placement.OptionsHelp())
	f.Uint64Var(&opts.Seed, "seed", 1, "seed of the simulation (vLLM front end, ties)")
	f.BoolVar(&opts.JSON, "json", false, "print the result as JSON")
	_ = cmd.MarkFlagRequired("journal")
	_ = cmd.MarkFlagRequired("farm")
	return cmd
}

func runTune(ctx context.Context, o *tuneOptions, out io.Writer) error {
	files, err := planner.JournalFiles(o.Journals)
	if err != nil {
		return err
	}
	variants, err := placement.ExpandSpecs(o.Variants)
	if err != nil {
		return fmt.Errorf("--variants: %w", err)
	}
	o.Variants = variants
	if len(o.Variants) == 0 {
		return errors.New("--variants: no variant given")
	}
	farm, err := tuneFarm(o.Farm)
	if err != nil {
		return err
	}
	res, err := planner.Tune(ctx, planner.TuneOptions{Files: files, Model: o.Model, Farm: farm, Variants: o.Variants, Seed: o.Seed})
	if err != nil {
		return err
	}
	best := &res.Variants[res.Recommended]
	// A journal without a model name (a trace from elsewhere) gets the
	// farm's, as the note says.
	res.Routing = routingYAML(cmp.Or(res.Journal.Model, farm.Spec.Model), best.Spec, routingOf(farm))
	if err := checkRoutingYAML(res.Routing, farm.Spec.Replicas); err != nil {
		return fmt.Errorf("tune: the recommended routing does not load in the proxy (a bug): %w", err)
	}
	if o.JSON {
		return writeJSON(out, res)
	}
	return writeTune(out, res, farm)
}

// farmRouting is what the farm's routing block gives every variant and the
// proxy config must say too: the spill threshold, the session TTL and the
// active window (resolved as placement and the proxy resolve them; a
// window of 0 is learned).
type farmRouting struct {
	spill       placement.SpillThreshold
	ttl, window time.Duration
}

func routingOf(f *sim.Farm) farmRouting {
	r := f.Spec.Routing
	ttl := cmp.Or(time.Duration(r.SessionTTL), placement.DefaultSessionTTL)
	window := time.Duration(r.ActiveWindow) // 0: learned, as the proxy learns it
	if window > 0 {
		window = min(window, ttl)
	}
	return farmRouting{spill: f.Spill, ttl: ttl, window: window}
}

// routingYAML is the recommended routing as the model's entry under
// models: in the proxy config (live.ModelCfg's keys), without its url or
// replicas, which stay as the operator has them.
func routingYAML(model string, v placement.Spec, fr farmRouting) string {
	var b strings.Builder
	fmt.Fprintf(&b, "models:\n  - name: %s\n", yamlString(model))
	fmt.Fprintf(&b, "    strategy: %s\n", v.Strategy)
	if v.Strategy == placement.StrategyAffinity {
		spill := fr.spill
		if v.Priced {
			spill = placement.SpillPriced()
		}
		fmt.Fprintf(&b, "    spill_threshold: %s\n", spill.String())
		if spill.Priced() {
			// The rate the proxy measures on each replica from vLLM's
			// prefill-time histogram, as the simulator's step-time model
			// stands for the farm's.
			b.WriteString("    prefill_tokens_per_s: metrics\n")
		}
		fmt.Fprintf(&b, "    session_ttl: %s\n", fr.ttl)
		if fr.window > 0 {
			fmt.Fprintf(&b, "    active_window: %s\n", fr.window)
		} else {
			b.WriteString("    # active_window unset: learned from the conversations' gaps, as simulated\n")
		}
		balance := placement.BalanceSessions
		if v.KV {
			balance = placement.BalanceKV
		}
		fmt.Fprintf(&b, "    balance: %s\n", balance)
		if v.Admit {
			timeout := v.AdmissionTimeout
			if timeout == 0 {
				timeout = live.DefaultAdmissionTimeout
			}
			fmt.Fprintf(&b, "    admission: kv\n    admission_timeout: %s\n", timeout)
		} else {
			fmt.Fprintf(&b, "    admission: %q\n", placement.AdmissionOff.String())
		}
		if v.Rehome { // only when on: off is the proxy's default
			fmt.Fprintf(&b, "    rehome: %s\n", placement.RehomeCold)
		}
		if v.Prefix { // it reads the replicas' KV events: the operator names them
			fmt.Fprintf(&b, "    prefix: %s # with kv_events: {endpoint: tcp://HOST:PORT} (vLLM's --kv-events-config)\n", placement.PrefixHeld)
		}
	}
	return b.String()
}

// yamlString writes s as a YAML scalar, quoted when it needs to be.
func yamlString(s string) string {
	if s == "" || strings.ContainsAny(s, ":#{}[],&*!|>'\"%@`\n") || strings.TrimSpace(s) != s {
		return strconv.Quote(s)
	}
	return s
}

// checkRoutingYAML loads the routing block with the proxy's config loader,
// in a config that gives it what it leaves out (listen, auth, the model's
// replicas).
func checkRoutingYAML(block string, replicas int) error {
	_, err := live.ParseConfig("recommended routing", []byte(tuneProxyConfig(block, replicas)))
	return err
}

// tuneProxyConfig completes the routing block into a whole proxy config:
// listen, auth passthrough and replicas placeholder URLs.
func tuneProxyConfig(block string, replicas int) string {
	urls := make([]string, replicas)
	for i := range urls {
		urls[i] = fmt.Sprintf("http://127.0.0.1:%d", 8000+i)
	}
	events := ""
	if strings.Contains(block, "    prefix: "+placement.PrefixHeld.String()) {
		events = "    kv_events: {endpoint: \"tcp://127.0.0.1:5557\"}\n" // the operator's, as the replicas
	}
	return "listen: 127.0.0.1:8080\nauth: passthrough\n" + block + events + "    replicas: [" + strings.Join(urls, ", ") + "]\n"
}

// tuneFarm loads the farm with the proxy's routing defaults in place of its
// routing block (a variant names every option it turns on).
func tuneFarm(path string) (*sim.Farm, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--farm: %w", err)
	}
	return sim.ParseFarmWith(data, path, func(s *sim.FarmSpec) {
		r := &s.Routing
		if r.SpillThreshold == "priced" {
			r.SpillThreshold = "auto"
		}
		r.Balance = placement.BalanceSessions.String()
		r.Admission = placement.AdmissionOff.String()
		r.AdmissionTimeout = sim.Duration(live.DefaultAdmissionTimeout)
		r.Balancer = sim.BalancerWarden
	})
}

// writeTune prints the table, the rule, the recommendation and the block.
func writeTune(w io.Writer, res *planner.TuneResult, farm *sim.Farm) error {
	var b bytes.Buffer
	jr := res.Journal
	files := jr.Files[0]
	if n := len(jr.Files); n > 1 {
		files = fmt.Sprintf("%d files, %s ... %s", n, jr.Files[0], jr.Files[n-1])
	}
	fmt.Fprintf(&b, "journal: %s: %s requests of %s sessions over %s s, model %s", files, num.Int(int64(jr.Requests)),
		num.Int(int64(jr.Sessions)), num.Format(float64(jr.DurationS), 1), cmp.Or(jr.Model, "(none)"))
	if jr.Skipped > 0 {
		fmt.Fprintf(&b, " (%d requests of other models left out)", jr.Skipped)
	}
	if len(jr.Empty) > 0 {
		fmt.Fprintf(&b, " (empty, skipped: %s)", strings.Join(jr.Empty, ", "))
	}
	fmt.Fprintf(&b, "\nfarm: %s: %d x %s with %s, %s KV blocks of %d tokens per replica; each session replayed from its recorded start, seed %d\n",
		farm.Name(), farm.Spec.Replicas, farm.GPU.Name, farm.Model.Name, num.Int(int64(farm.NumGPUBlocks)), farm.Spec.VLLM.BlockSize, res.Seed)
	for _, n := range res.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "variant\thit %\tTTFB p50 s\tTTFB p95 s\toutput tok/min\tsessions/h\twaited / refused / retried\tfinished / unfinished\t")
	for i, v := range res.Variants {
		adm := "-"
		if v.Spec.Admit {
			adm = fmt.Sprintf("%d / %d / %d", v.AdmissionWaits, v.AdmissionRefused, v.AdmissionRetries)
		}
		mark := ""
		switch {
		case i == res.Recommended:
			mark = "  <- recommended"
		case v.Peer:
			mark = "  (a peer's router: the proxy does not serve it)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d / %d\t%s\n", v.Name,
			num.Format(float64(v.PrefixHitPct), 1), num.Format(float64(v.TTFBP50), 2), num.Format(float64(v.TTFBP95), 2),
			num.Format(float64(v.OutputTokensPerMin), 0), num.Format(float64(v.SessionsPerHour), 0), adm, v.Finished, v.Unfinished, mark)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(&b, "\nrule: %s\nreference: TTFB p95 %s s (%s)\nrecommended: %s\n", res.Rule, num.Format(float64(res.Reference), 2), res.ReferenceVariant, res.Why)
	fmt.Fprintf(&b, "\nrouting: the keys of this model's entry under models: in the proxy config (keep its url or replicas):\n\n%s", res.Routing)
	_, err := w.Write(b.Bytes())
	return err
}
