package epp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/lm-warden/warden/live"
)

// Health services, as the Endpoint Picker Protocol names them.
const (
	ServiceLiveness  = "liveness"
	ServiceReadiness = "readiness"
	ServiceExtProc   = "envoy.service.ext_proc.v3.ExternalProcessor"
)

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

// Server is the endpoint picker: live's decision step behind ext_proc.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	live   *live.Server
	log    *slog.Logger
	health *health.Server
	grpc   *grpc.Server
}

// Option configures a Server.
type Option func(*Server)

// WithLogger sets the logger (default: slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *Server) { s.log = l } }

// New builds the picker over a live server built from the EPP's
// configuration (see CheckConfig). It starts nothing.
func New(ls *live.Server, opts ...Option) *Server {
	s := &Server{live: ls, log: slog.Default(), health: health.NewServer()}
	for _, o := range opts {
		o(s)
	}
	// Until Serve runs, only liveness answers SERVING.
	s.health.SetServingStatus(ServiceLiveness, healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(ServiceReadiness, healthpb.HealthCheckResponse_NOT_SERVING)
	s.health.SetServingStatus(ServiceExtProc, healthpb.HealthCheckResponse_NOT_SERVING)
	// Windows of 1 MiB: a 64 KiB body and its echo do not wait for
	// window updates (gRPC's default is 64 KiB; Envoy's own stream window
	// is 256 MiB).
	s.grpc = grpc.NewServer(grpc.MaxRecvMsgSize(maxMessage), grpc.InitialWindowSize(1<<20), grpc.InitialConnWindowSize(1<<20))
	extprocv3.RegisterExternalProcessorServer(s.grpc, s)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	return s
}

// maxMessage bounds one gRPC message the gateway sends: Envoy sends a
// body in chunks of its buffer size (64 KiB by default); 4 MiB is gRPC's
// default too.
const maxMessage = 4 << 20

// Serve serves ext_proc and the health services on ln and live's admin
// handler (/metrics, /api/status, the dashboard) on adminLn (nil: none)
// until ctx is done. It then drains: readiness turns NOT_SERVING, streams
// in progress get timeouts.drain to end, the rest are cut.
func (s *Server) Serve(ctx context.Context, ln, adminLn net.Listener) error {
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	runDone := make(chan error, 1)
	go func() { runDone <- s.live.Run(runCtx, adminLn) }()

	s.health.SetServingStatus(ServiceReadiness, healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(ServiceExtProc, healthpb.HealthCheckResponse_SERVING)
	errc := make(chan error, 1)
	go func() { errc <- s.grpc.Serve(ln) }()

	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	case err = <-runDone:
		runDone = nil
	}
	drain := s.live.DrainTimeout()
	s.log.Info("draining", "deadline", drain)
	s.health.SetServingStatus(ServiceReadiness, healthpb.HealthCheckResponse_NOT_SERVING)
	s.health.SetServingStatus(ServiceExtProc, healthpb.HealthCheckResponse_NOT_SERVING)
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
