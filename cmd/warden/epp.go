package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/lm-warden/warden/epp"
	"github.com/lm-warden/warden/live"
)

// eppOptions are the flags of `warden epp`.
type eppOptions struct {
	Config   string
	Check    bool
	LogLevel string
}

func newEPPCmd() *cobra.Command {
	opts := &eppOptions{}
	cmd := &cobra.Command{
		Use:   "epp",
		Short: "Pick endpoints for a Kubernetes gateway (Gateway API Inference Extension), keeping each conversation home",
		Long: `Run warden as the endpoint picker (EPP) of a Gateway API Inference Extension
InferencePool: the gateway (Envoy Gateway, kgateway, Istio, GKE) asks it over
Envoy's ext_proc gRPC protocol which endpoint serves each request, and forwards
the request there itself. The picks are the proxy's: the same session ids and
checks, the same placement, the same session table shared through
session_store (several pickers active-active agree on homes).

The configuration is the proxy's (see warden proxy): listen is the gRPC
address the gateway's ext_proc filter calls, admin serves /metrics, the
dashboard and /api/status, and each model's replicas are the pool's
endpoints, http://IP:PORT, one per pod and target port. gRPC health services:
liveness, readiness and envoy.service.ext_proc.v3.ExternalProcessor. SIGHUP
reloads (homes of the endpoints kept), SIGTERM drains (readiness goes
NOT_SERVING, streams in progress get timeouts.drain).

See epp/testdata/epp.yaml for an example and deploy/kubernetes/ for the
manifests.`,
		Example: `  warden epp --config epp.yaml
  warden epp --config epp/testdata/epp.yaml --check`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runEPP(cmd.Context(), opts, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Config, "config", "", "configuration (YAML, the proxy's format) (required)")
	f.BoolVar(&opts.Check, "check", false, "validate the configuration and exit")
	f.StringVar(&opts.LogLevel, "log-level", "info", "log level: debug, info, warn or error (logs go to stderr)")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}

// loadEPPConfig reads the configuration and checks what the picker needs
// of it beyond the proxy's rules.
func loadEPPConfig(path string) (*live.Config, error) {
	cfg, err := live.LoadConfig(path)
	if err != nil {
		return nil, err
	}
	if err := epp.CheckConfig(cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

func runEPP(ctx context.Context, opts *eppOptions, out, logOut io.Writer) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(opts.LogLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	cfg, err := loadEPPConfig(opts.Config)
	if err != nil {
		return err
	}
	if opts.Check {
		n := 0
		for _, m := range cfg.Models {
			n += m.NumReplicas()
		}
		_, err := fmt.Fprintf(out, "%s: OK, %d model(s), %d endpoint(s)\n", opts.Config, len(cfg.Models), n)
		return err
	}
	logger := slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: level}))
	ls, err := live.NewServer(cfg, live.WithLogger(logger), dashboard())
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
	if _, err := fmt.Fprintf(out, "warden epp: ext_proc gRPC on %s (admin http://%s)\n", ln.Addr(), adminLn.Addr()); err != nil {
		ln.Close()
		adminLn.Close()
		return err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				next, err := loadEPPConfig(opts.Config)
				if err == nil {
					err = ls.Reload(next)
				}
				if err != nil {
					logger.Error("reload failed; keeping the running configuration", "err", err)
					continue
				}
				fmt.Fprintf(out, "reloaded %s\n", opts.Config)
			}
		}
	}()
	return epp.New(ls, epp.WithLogger(logger)).Serve(ctx, ln, adminLn)
}
