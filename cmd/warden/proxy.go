package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"sync"

	"github.com/spf13/cobra"

	"github.com/lm-warden/warden/internal/procs"
	"github.com/lm-warden/warden/live"
	"github.com/lm-warden/warden/web"
)

// proxyOptions are the flags of `warden proxy`.
type proxyOptions struct {
	Config   string
	Check    bool
	LogLevel string
	// SessionKeyFile holds session_key (a Kubernetes Secret's key mounted
	// as a file, a systemd credential).
	SessionKeyFile string
	// Procs: "auto" sizes GOMAXPROCS to the load (internal/procs), unless
	// GOMAXPROCS is set in the environment; "" leaves it as it is (tests
	// that run the proxy in their own process).
	Procs string
}

func newProxyCmd() *cobra.Command {
	opts := &proxyOptions{}
	cmd := &cobra.Command{
		Use:   "proxy",
		Short: "Route live OpenAI/Anthropic traffic to vLLM replicas, keeping each conversation home",
		Long: `Run the production router in front of vLLM replicas. Each request's session id
(X-Claude-Code-Session-Id, session-id, x-session-id, metadata.user_id,
prompt_cache_key, user, else a hash of the system prompt and first user message)
is kept on the replica that holds its prefix cache; a turn spills elsewhere only
while its home is over the spill threshold.

The admin address serves the dashboard (/: the routing panel of every model,
/stats: the last hour, kept by the proxy: prompt tokens per second, cached and
computed, completion tokens per second and the hit rate, per replica too; echarts
is served from the binary), /metrics (Prometheus), /api/status and /api/history
(JSON) and /healthz (503 while the client listener is at limits.max_connections
or cannot accept: out of file descriptors); it answers only a Host header that
names it (an IP address, localhost, this machine's name, admin_hosts), and
serves at most 64 connections at once (idle ones closed after 30 s): over
them /healthz is still answered, any other request gets 503.
SIGHUP reloads the configuration without dropping connections or sessions:
every session whose home replica is still configured keeps it, a replica
added takes new sessions only, and running streams keep their in-flight
count. listen, admin, session_key, journal, limits.max_connections and timeouts
read_header, read and idle take effect on restart only (the reload's warning names the ones that
changed). SIGTERM drains (stops accepting, lets streams finish up to
timeouts.drain).

session_key is a secret (several proxies sharing session_store need the
same one): keep it out of the configuration (a placeholder such as
change-me-... is refused) and give it with --session-key-file, a file
only warden reads (a Kubernetes Secret mounted as a file, a systemd
credential); a reload reads the file again. --check without
--session-key-file accepts a store whose key is to come that way.

See live/testdata/proxy.yaml for every configuration key.`,
		Example: `  warden proxy --config proxy.yaml
  warden proxy --config proxy.yaml --procs 4   # GOMAXPROCS fixed at 4, not sized to the load
  warden proxy --config live/testdata/proxy.yaml --check
  warden proxy --config proxy-shared.yaml --session-key-file /etc/warden/session-key
  kill -HUP $(pidof warden)      # reload proxy.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runProxy(cmd.Context(), opts, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	addFrontEndFlags(f, &opts.Config, &opts.Check, &opts.LogLevel, &opts.SessionKeyFile, "proxy configuration (YAML)")
	f.StringVar(&opts.Procs, "procs", "auto", "threads running Go code at once (GOMAXPROCS): auto sizes them to the load, from 1 up to the CPUs (idle ones cost CPU to wake); N fixes them; auto leaves a GOMAXPROCS environment variable as it is")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}

// dashboard mounts web's dashboard at the root of the admin listener: / and
// /stats, with echarts under /static/. The dashboard polls /api/status (and
// the stats page /api/history); the
// admin mux's own routes (/metrics, /api/status, /healthz) are more specific
// and keep precedence.
func dashboard() live.Option {
	return live.WithAdminHandler("/", web.DashboardHandler(web.DashboardOptions{Prefix: "/", StatusURL: "/api/status", HistoryURL: "/api/history"}))
}

func runProxy(ctx context.Context, opts *proxyOptions, out, logOut io.Writer) error {
	fixed := 0
	if opts.Procs != "" && opts.Procs != "auto" {
		n, err := strconv.Atoi(opts.Procs)
		if err != nil || n < 1 {
			return fmt.Errorf("--procs %q: want auto or a number of threads from 1", opts.Procs)
		}
		fixed = n
	}
	logger, err := newLogger(opts.LogLevel, logOut)
	if err != nil {
		return err
	}
	cfg, err := loadProxyConfig(opts)
	if err != nil {
		return err
	}
	if opts.Check {
		if err := noteKeyToCome(out, opts.Config, cfg, "the proxy"); err != nil {
			return err
		}
		_, err := fmt.Fprintf(out, "%s: OK, %d model(s)\n", opts.Config, len(cfg.Models))
		return err
	}
	srv, err := live.NewServer(cfg, live.WithLogger(logger), dashboard())
	if err != nil {
		return err
	}
	return frontEnd{
		addrs: []listenAddr{{addr: cfg.Listen}, {addr: cfg.Admin}},
		banner: func(lns []net.Listener) string {
			return fmt.Sprintf("warden proxy listening on http://%s (admin http://%s)", lns[0].Addr(), lns[1].Addr())
		},
		config: opts.Config,
		load:   func() (*live.Config, error) { return loadProxyConfig(opts) },
		apply:  srv.Reload,
		serve: func(ctx context.Context, lns []net.Listener) error {
			var governor sync.WaitGroup
			ctx, cancel := context.WithCancel(ctx)
			defer func() { cancel(); governor.Wait() }()
			if fixed > 0 {
				runtime.GOMAXPROCS(fixed)
			} else if opts.Procs == "auto" && procs.Auto() {
				governor.Go(func() { procs.Run(ctx, procs.Options{Log: logger}) })
			}
			return srv.Serve(ctx, lns[0], lns[1])
		},
	}.run(ctx, out, logger)
}

// loadProxyConfig reads the configuration, session_key from
// --session-key-file when given.
func loadProxyConfig(opts *proxyOptions) (*live.Config, error) {
	keys, err := sessionKeys(opts.SessionKeyFile, opts.Check)
	if err != nil {
		return nil, err
	}
	return live.LoadConfigKeyed(opts.Config, keys, nil)
}

// sessionKeys is where session_key comes from besides the configuration
// (warden proxy and warden epp): the key in file (--session-key-file),
// else, under --check, a key to come at run.
func sessionKeys(file string, check bool) (live.KeyOptions, error) {
	if file == "" {
		return live.KeyOptions{Later: check}, nil
	}
	key, err := live.ReadSessionKey(file)
	if err != nil {
		return live.KeyOptions{}, err
	}
	return live.KeyOptions{Key: key}, nil
}

// noteKeyToCome says, for --check, that cfg's session_store waits for its
// key from --session-key-file (who runs: "the proxy", "the picker").
func noteKeyToCome(out io.Writer, name string, cfg *live.Config, who string) error {
	if !cfg.KeyToCome() {
		return nil
	}
	_, err := fmt.Fprintf(out, "%s: session_key: none in the file: give it with --session-key-file when %s runs\n", name, who)
	return err
}
