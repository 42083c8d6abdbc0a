package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/spf13/cobra"

	"github.com/lm-warden/warden/epp"
	"github.com/lm-warden/warden/live"
)

// eppOptions are the flags of `warden epp`.
type eppOptions struct {
	Config   string
	Check    bool
	LogLevel string
	// HealthListen is the health port's address ("": none).
	HealthListen string
	// SessionKeyFile holds session_key (a Kubernetes Secret's key).
	SessionKeyFile string

	// Kubernetes: the endpoints are the ready pods of the InferencePool
	// Pool in Namespace, found through the Kubernetes API.
	Kubernetes bool
	Kubeconfig string
	Namespace  string
	Pool       string
	// Service is the picker's own Service: its admin address answers
	// requests that name it (a scrape by Service DNS).
	Service string
	// resolvConf is the resolver's configuration whose search domains
	// complete Service's names ("": /etc/resolv.conf).
	resolvConf string
	// connect builds the Kubernetes clients (nil: connectKube); tests
	// give client-go's fakes.
	connect func(kubeconfig string) (kubeClients, string, error)
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
dashboard and /api/status (at most 64 connections at once, as the proxy's),
and each model's replicas are the pool's
endpoints, http://IP:PORT, one per pod and target port. gRPC health services
on the gRPC address and, alone, on --health-listen (9003, where the llm-d
chart and the Inference Extension's conformance manifests probe):
liveness, readiness, inference-extension and
envoy.service.ext_proc.v3.ExternalProcessor. SIGHUP reloads (homes of the
endpoints kept), SIGTERM drains (readiness goes NOT_SERVING, streams in
progress get timeouts.drain).

The gateway's connections are bounded as the proxy's clients are:
limits.max_connections open at once, limits.max_in_flight streams each,
the HTTP/2 preface within timeouts.read_header, a connection without a
stream for timeouts.idle closed. A request must arrive whole within
timeouts.read (else 408), and the request bodies held at once, across
streams, within limits.max_body_bytes_in_flight, as in the proxy (past it
429, Retry-After). A request to a path that
is no inference API, or without a body, goes to the endpoint with the
fewest requests in flight, uncounted.

With several pickers sharing session_store, session_key is the same
secret on each: keep it out of the configuration (a placeholder such as
change-me-... is refused) and give it with --session-key-file, the key of a
Kubernetes Secret mounted as a file. --check without --session-key-file
accepts a store whose key is to come that way.

With --kubernetes the endpoints are the ready pods of the InferencePool
named by --pool (inference.networking.k8s.io/v1), one per pod and
spec.targetPorts number, followed through the Kubernetes API: pods that
come, turn ready or unready and go, and a pool whose selector or target
ports change, reload the picker as SIGHUP does (the homes of the endpoints
that stay are kept). The configuration then lists no replicas. The API is
reached as kubectl reaches it (--kubeconfig, else $KUBECONFIG or
~/.kube/config) or, in a pod with neither, through its service account,
which needs get, list and watch on pods and inferencepools
(deploy/kubernetes/rbac.yaml). --service names the picker's own Service, so
that its admin address answers requests to that name (NAME, NAME.NAMESPACE,
NAME.NAMESPACE.svc and NAME under the pod's DNS search domains, e.g.
NAME.NAMESPACE.svc.cluster.local): a Prometheus scrape by Service DNS.

See epp/testdata/epp.yaml for an example and deploy/kubernetes/ for the
manifests.`,
		Example: `  warden epp --config epp.yaml --session-key-file /etc/warden/secret/session-key
  warden epp --config epp/testdata/epp.yaml --check
  warden epp --config /etc/warden/epp.yaml --kubernetes --pool qwen3-pool --service warden-epp \
    --session-key-file /etc/warden/secret/session-key --health-listen 0.0.0.0:9003
  warden epp --config deploy/kubernetes/config/epp.yaml --kubernetes --check`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runEPP(cmd.Context(), opts, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	addFrontEndFlags(f, &opts.Config, &opts.Check, &opts.LogLevel, &opts.SessionKeyFile, "configuration (YAML, the proxy's format)")
	f.StringVar(&opts.HealthListen, "health-listen", epp.DefaultHealthListen, "the gRPC health port's address (\"\": none)")
	f.StringVar(&opts.Service, "service", "", "with --kubernetes: the picker's own Service, whose names the admin address answers")
	f.BoolVar(&opts.Kubernetes, "kubernetes", false, "the endpoints are the ready pods of the InferencePool --pool, found through the Kubernetes API")
	f.StringVar(&opts.Pool, "pool", "", "with --kubernetes: the InferencePool's name")
	f.StringVar(&opts.Namespace, "namespace", "", "with --kubernetes: the pool's namespace (default: the pod's own in a cluster, else the kubeconfig context's)")
	f.StringVar(&opts.Kubeconfig, "kubeconfig", "", "with --kubernetes: a kubeconfig file (default: $KUBECONFIG or ~/.kube/config, else in a pod its service account)")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}

// loadEPPConfig reads the configuration and checks what the picker needs
// of it beyond the proxy's rules (epp.ParseConfig); with --kubernetes it
// lists no replicas (the pool's pods are). The session key comes from
// --session-key-file when given.
func loadEPPConfig(opts *eppOptions) (*live.Config, error) {
	keys, err := sessionKeys(opts.SessionKeyFile, opts.Check)
	if err != nil {
		return nil, err
	}
	return epp.LoadConfig(opts.Config, epp.ConfigOptions{Kubernetes: opts.Kubernetes, Keys: keys})
}

// checkKubeFlags refuses the Kubernetes flags without --kubernetes, and
// --kubernetes without a pool outside --check.
func checkKubeFlags(opts *eppOptions) error {
	if !opts.Kubernetes {
		for _, f := range []struct{ flag, v string }{{"--pool", opts.Pool}, {"--namespace", opts.Namespace}, {"--kubeconfig", opts.Kubeconfig}, {"--service", opts.Service}} {
			if f.v != "" {
				return fmt.Errorf("%s needs --kubernetes", f.flag)
			}
		}
		return nil
	}
	if opts.Pool == "" && !opts.Check {
		return errors.New("--kubernetes needs --pool NAME: the InferencePool whose pods are the endpoints")
	}
	return nil
}

func runEPP(ctx context.Context, opts *eppOptions, out, logOut io.Writer) error {
	logger, err := newLogger(opts.LogLevel, logOut)
	if err != nil {
		return err
	}
	if err := checkKubeFlags(opts); err != nil {
		return err
	}
	cfg, err := loadEPPConfig(opts)
	if err != nil {
		return err
	}
	if opts.HealthListen != "" {
		if _, _, err := net.SplitHostPort(opts.HealthListen); err != nil {
			return fmt.Errorf("--health-listen %q: want HOST:PORT: %w", opts.HealthListen, err)
		}
	}
	if opts.Check {
		if err := noteKeyToCome(out, opts.Config, cfg, "the picker"); err != nil {
			return err
		}
		if opts.Kubernetes {
			_, err := fmt.Fprintf(out, "%s: OK, %d model(s), endpoints from the InferencePool's ready pods (--kubernetes)\n", opts.Config, len(cfg.Models))
			return err
		}
		n := 0
		for _, m := range cfg.Models {
			n += m.NumReplicas()
		}
		_, err := fmt.Fprintf(out, "%s: OK, %d model(s), %d endpoint(s)\n", opts.Config, len(cfg.Models), n)
		return err
	}
	var (
		kc kubeClients
		ns string
	)
	if opts.Kubernetes {
		connect := opts.connect
		if connect == nil {
			connect = connectKube
		}
		if kc, ns, err = connect(opts.Kubeconfig); err != nil {
			return err
		}
		if opts.Namespace != "" {
			ns = opts.Namespace
		}
	}
	var hosts []string
	if opts.Service != "" {
		conf := opts.resolvConf
		if conf == "" {
			conf = "/etc/resolv.conf"
		}
		hosts = serviceNames(opts.Service, ns, searchDomains(conf))
	}
	rs, err := newReplicaSet(cfg, opts.Kubernetes, hosts, live.WithLogger(logger), dashboard())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if opts.Kubernetes {
		done, err := followPool(ctx, kc, ns, opts.Pool, rs, logger)
		if err != nil {
			return err
		}
		defer func() {
			cancel()
			if err := <-done; err != nil {
				logger.Error("following the InferencePool failed", "pool", opts.Pool, "namespace", ns, "err", err)
			}
		}()
	}
	return frontEnd{
		addrs: []listenAddr{{addr: cfg.Listen}, {addr: cfg.Admin}, {addr: opts.HealthListen, flag: "--health-listen"}},
		banner: func(lns []net.Listener) string {
			health := "none"
			if lns[2] != nil {
				health = lns[2].Addr().String()
			}
			return fmt.Sprintf("warden epp: ext_proc gRPC on %s (admin http://%s, gRPC health on %s)", lns[0].Addr(), lns[1].Addr(), health)
		},
		config: opts.Config,
		load:   func() (*live.Config, error) { return loadEPPConfig(opts) },
		apply:  rs.setConfig,
		serve: func(ctx context.Context, lns []net.Listener) error {
			return epp.New(rs.ls, epp.WithLogger(logger)).Serve(ctx, epp.Listeners{ExtProc: lns[0], Admin: lns[1], Health: lns[2]})
		},
	}.run(ctx, out, logger)
}
