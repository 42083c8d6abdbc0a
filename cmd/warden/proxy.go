package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"sync"
	"syscall"

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
names it (an IP address, localhost, this machine's name, admin_hosts).
SIGHUP reloads the configuration without dropping connections or sessions:
every session whose home replica is still configured keeps it, a replica
added takes new sessions only, and running streams keep their in-flight
count. listen, admin, session_key, journal, limits.max_connections and timeouts
read_header, read and idle take effect on restart only (the reload's warning names the ones that
changed). SIGTERM drains (stops accepting, lets streams finish up to
timeouts.drain).

See live/testdata/proxy.yaml for every configuration key.`,
		Example: `  warden proxy --config proxy.yaml
  warden proxy --config proxy.yaml --procs 4   # GOMAXPROCS fixed at 4, not sized to the load
  warden proxy --config live/testdata/proxy.yaml --check
  kill -HUP $(pidof warden)      # reload proxy.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runProxy(cmd.Context(), opts, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Config, "config", "", "proxy configuration (YAML) (required)")
	f.BoolVar(&opts.Check, "check", false, "validate the configuration and exit")
	f.StringVar(&opts.LogLevel, "log-level", "info", "log level: debug, info, warn or error (logs go to stderr)")
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
	var level slog.Level
	if err := level.UnmarshalText([]byte(opts.LogLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	cfg, err := live.LoadConfig(opts.Config)
	if err != nil {
		return err
	}
	if opts.Check {
		_, err := fmt.Fprintf(out, "%s: OK, %d model(s)\n", opts.Config, len(cfg.Models))
		return err
	}
	logger := slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: level}))
	srv, err := live.NewServer(cfg, live.WithLogger(logger), dashboard())
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	adminLn, err := net.Listen("tcp", cfg.Admin)
	if err != nil {
		ln.Close()
		return err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	// Print before the reload loop starts (both write to out) and after
	// SIGHUP is caught (a reload may follow the line at once).
	if _, err := fmt.Fprintf(out, "warden proxy listening on http://%s (admin http://%s)\n", ln.Addr(), adminLn.Addr()); err != nil {
		ln.Close()
		adminLn.Close()
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var governor sync.WaitGroup
	defer func() { cancel(); governor.Wait() }()
	if fixed > 0 {
		runtime.GOMAXPROCS(fixed)
	} else if opts.Procs == "auto" && procs.Auto() {
		governor.Go(func() { procs.Run(ctx, procs.Options{Log: logger}) })
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				next, err := live.LoadConfig(opts.Config)
				if err == nil {
					err = srv.Reload(next)
				}
				if err != nil {
					logger.Error("reload failed; keeping the running configuration", "err", err)
					continue
				}
				fmt.Fprintf(out, "reloaded %s\n", opts.Config)
			}
		}
	}()
	return srv.Serve(ctx, ln, adminLn)
}
