package epp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/url"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/lm-warden/warden/live"
)

// Health services, as the Endpoint Picker Protocol names them, and
// ServiceInferenceExtension, the name under which the llm-d chart and the
// Gateway API Inference Extension's conformance manifests probe the
// picker's health port (gateway-api-inference-extension
// conformance/resources/base.yaml: grpc probe, port 9003, service
// inference-extension; pkg/lwepp/server/runserver.go HealthServerRunnable).
// It answers as readiness does.
const (
	ServiceLiveness           = "liveness"
	ServiceReadiness          = "readiness"
	ServiceExtProc            = "envoy.service.ext_proc.v3.ExternalProcessor"
	ServiceInferenceExtension = "inference-extension"
)

// DefaultHealthListen is the health port's address when none is given:
// 9003, the GAIE reference picker's --grpc-health-port default
// (pkg/lwepp/server/options.go DefaultGrpcHealthPort).
const DefaultHealthListen = "0.0.0.0:9003"

// Metadata keys of the Endpoint Picker Protocol.
const (
	// HeaderDestination is the request header, and the key in the
	// NamespaceLB dynamic metadata, of the picked endpoints.
	HeaderDestination = "x-gateway-destination-endpoint"
	// KeyServed is the key, in the NamespaceLB metadata of the response
	// phase, of the endpoint that served the request.
	KeyServed = "x-gateway-destination-endpoint-served"
	// KeySubset is the key, in the NamespaceSubset metadata of the
	// request, of the endpoints the picker must choose from.
	KeySubset       = "x-gateway-destination-endpoint-subset"
	NamespaceLB     = "envoy.lb"
	NamespaceSubset = "envoy.lb.subset_hint"
)

// Router is what the picker needs of the proxy: its decision port for
// each request (live.Decider), and the lifecycle around it that a front
// end with its own listener drives. *live.Server is one.
type Router interface {
	live.Decider
	// ClientListener bounds the gateway's connections as the proxy's
	// clients' are; Run serves the scrape, health and store loops and the
	// admin handler until its context is done.
	ClientListener(ln net.Listener) net.Listener
	Run(ctx context.Context, adminLn net.Listener) error
	// DrainTimeout is timeouts.drain, Limits the current limits.
	DrainTimeout() time.Duration
	Limits() live.Limits
}

// Server is the endpoint picker: live's decision step behind ext_proc.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	router     Router       // Serve's lifecycle
	live       live.Decider // the request path's one port (process.go)
	log        *slog.Logger
	health     *health.Server
	grpc       *grpc.Server        // ext_proc and health
	healthGRPC *grpc.Server        // health alone, on the health port
	grpcOpts   []grpc.ServerOption // tests: interceptors
}

// Option configures a Server.
type Option func(*Server)

// WithLogger sets the logger (default: slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *Server) { s.log = l } }

// New builds the picker over a router (a *live.Server built from the
// EPP's configuration, see CheckConfig). It starts nothing.
func New(ls Router, opts ...Option) *Server {
	s := &Server{router: ls, live: ls, log: slog.Default(), health: health.NewServer()}
	for _, o := range opts {
		o(s)
	}
	// Until Serve runs, only liveness answers SERVING.
	s.health.SetServingStatus(ServiceLiveness, healthpb.HealthCheckResponse_SERVING)
	for _, svc := range []string{ServiceReadiness, ServiceExtProc, ServiceInferenceExtension} {
		s.health.SetServingStatus(svc, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	s.grpc = grpc.NewServer(append(serverOptions(ls.Limits(), ls.Timeouts()), s.grpcOpts...)...)
	extprocv3.RegisterExternalProcessorServer(s.grpc, s)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	s.healthGRPC = grpc.NewServer(healthServerOptions()...)
	healthpb.RegisterHealthServer(s.healthGRPC, s.health)
	return s
}

// maxMessage bounds one gRPC message the gateway sends: Envoy sends a
// body in chunks of its buffer size (64 KiB by default); 4 MiB is gRPC's
// default too.
const maxMessage = 4 << 20

// serverOptions are the gRPC server's bounds on what a gateway's
// connection may hold (issue 46, item 4): the connections themselves are
// bounded by limits.max_connections (live's client listener, Serve);
// per connection, gRPC's own limits:
//
//   - MaxConcurrentStreams: limits.max_in_flight streams, as many as the
//     picker admits requests at once (Envoy multiplexes every request's
//     ext_proc stream over few connections, one per worker thread, so
//     one connection carries many), and never fewer than the 100 that
//     RFC 9113 (section 6.5.2) recommends;
//   - ConnectionTimeout: the HTTP/2 preface and settings within
//     timeouts.read_header, as a request's headers must come on the
//     proxy's listener (gRPC's default is 120 s);
//   - keepalive: a connection with no stream for timeouts.idle is closed
//     (idle keep-alive connections on the proxy's listener likewise); a
//     peer silent for keepaliveTime is pinged and cut after
//     keepaliveTimeout without an answer; a client's pings are accepted
//     down to one every keepaliveMinPing, streams or not (Envoy pings
//     idle connections when its cluster sets connection_keepalive), and
//     a flood of pings closes the connection (GOAWAY too_many_pings).
//
// Windows of 1 MiB: a 64 KiB body and its echo do not wait for window
// updates (gRPC's default is 64 KiB; Envoy's own stream window is
// 256 MiB).
func serverOptions(l live.Limits, t live.Timeouts) []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxMessage),
		grpc.InitialWindowSize(1 << 20), grpc.InitialConnWindowSize(1 << 20),
		grpc.MaxConcurrentStreams(uint32(min(max(l.MaxInFlight, minStreams), math.MaxUint32))),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: max(t.Idle.D(), 0), Time: keepaliveTime, Timeout: keepaliveTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveMinPing, PermitWithoutStream: true}),
	}
	if t.ReadHeader.D() > 0 { // below 0: none, as on the proxy's listener
		opts = append(opts, grpc.ConnectionTimeout(t.ReadHeader.D()))
	}
	return opts
}

const (
	minStreams       = 100
	keepaliveTime    = time.Minute
	keepaliveTimeout = 20 * time.Second
	keepaliveMinPing = 10 * time.Second
)

// The health port serves probes: a kubelet opens a connection per probe
// and closes it. At most healthMaxConns connections are open there at
// once (more wait in the kernel's backlog), each must send its preface
// within healthPreface and is closed after healthIdle without a stream.
const (
	healthMaxConns = 32
	healthPreface  = 2 * time.Second
	healthIdle     = 10 * time.Second
)

func healthServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(4 << 10), grpc.MaxConcurrentStreams(4),
		grpc.ConnectionTimeout(healthPreface),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: healthIdle, Time: keepaliveTime, Timeout: keepaliveTimeout}),
	}
}

// Listeners are where the picker serves.
type Listeners struct {
	// ExtProc serves ext_proc and the health services (the gateway's
	// address); required. It is wrapped by live's client listener:
	// limits.max_connections.
	ExtProc net.Listener
	// Admin serves live's admin handler (/metrics, /api/status, /healthz,
	// the dashboard); nil: none.
	Admin net.Listener
	// Health serves the health services alone (the probes' port,
	// DefaultHealthListen); nil: none.
	Health net.Listener
}

// Serve serves ext_proc and the health services on l.ExtProc, the health
// services on l.Health and live's admin handler on l.Admin until ctx is
// done. It then drains: readiness turns NOT_SERVING, streams in progress
// get timeouts.drain to end, the rest are cut.
func (s *Server) Serve(ctx context.Context, l Listeners) error {
	ln := s.router.ClientListener(l.ExtProc)
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	runDone := make(chan error, 1)
	go func() { runDone <- s.router.Run(runCtx, l.Admin) }()

	for _, svc := range []string{ServiceReadiness, ServiceExtProc, ServiceInferenceExtension} {
		s.health.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
	}
	errc := make(chan error, 2)
	go func() { errc <- s.grpc.Serve(ln) }()
	healthDone := make(chan struct{})
	if l.Health != nil {
		go func() {
			defer close(healthDone)
			if err := s.healthGRPC.Serve(netutil.LimitListener(l.Health, healthMaxConns)); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				errc <- fmt.Errorf("health port: %w", err)
			}
		}()
	} else {
		close(healthDone)
	}

	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	case err = <-runDone:
		runDone = nil
	}
	drain := s.router.DrainTimeout()
	s.log.Info("draining", "deadline", drain)
	for _, svc := range []string{ServiceReadiness, ServiceExtProc, ServiceInferenceExtension} {
		s.health.SetServingStatus(svc, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(drain):
		s.log.Warn("drain deadline passed; closing the streams still open")
		s.grpc.Stop()
		<-stopped
	}
	// The health port answers NOT_SERVING through the drain, then stops.
	s.healthGRPC.Stop()
	<-healthDone
	stopRun()
	if runDone != nil {
		if e := <-runDone; e != nil && err == nil {
			err = e
		}
	}
	if errors.Is(err, grpc.ErrServerStopped) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("epp: serve: %w", err)
	}
	return nil
}

// CheckConfig checks what the picker needs of a proxy configuration
// beyond what live.ParseConfig checks: every replica is an endpoint the
// gateway can be told, http://IP:PORT (the Endpoint Picker Protocol
// passes ip:port; a host name or a path cannot go there).
func CheckConfig(cfg *live.Config) error {
	for i, m := range cfg.Models {
		if m.URL != "" {
			return fmt.Errorf("models[%d] (%s): url with data_parallel_size: the picker names endpoints, not ranks behind one URL: list each rank's port under replicas (http://IP:PORT, one per target port)", i, m.Name)
		}
		for j, r := range m.Replicas {
			if err := checkEndpointURL(r); err != nil {
				return fmt.Errorf("models[%d].replicas[%d] (%s): %w", i, j, m.Name, err)
			}
		}
	}
	return nil
}

func checkEndpointURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if u.Scheme != "http" {
		return fmt.Errorf("%q: want http://IP:PORT (the gateway connects to the endpoint itself; TLS is its own setting)", raw)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || port == "" {
		return fmt.Errorf("%q: want http://IP:PORT with the port", raw)
	}
	if net.ParseIP(host) == nil {
		return fmt.Errorf("%q: %q is not an IP address: the Endpoint Picker Protocol names endpoints as ip:port", raw, host)
	}
	if u.Path != "" && u.Path != "/" {
		return fmt.Errorf("%q: an endpoint has no path", raw)
	}
	return nil
}

// withServerOptions adds options to the ext_proc gRPC server (tests:
// an interceptor that records what the gateway sends).
func withServerOptions(o ...grpc.ServerOption) Option {
	return func(s *Server) { s.grpcOpts = append(s.grpcOpts, o...) }
}
