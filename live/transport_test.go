package live

import (
	"net/http"
	"testing"
	"time"
)

// The backend transport starts from net/http's defaults (a TLS handshake
// timeout for https:// replicas, among others) and keeps its own tuning.
func TestBackendTransport(t *testing.T) {
	cfg, err := ParseConfig("t.yaml", []byte("listen: 127.0.0.1:0\nauth: passthrough\ntimeouts: {response_header: 7m}\nmodels:\n  - name: m\n    replicas: [https://a:1]\n"))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr, def := srv.base, http.DefaultTransport.(*http.Transport)
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"TLSHandshakeTimeout", tr.TLSHandshakeTimeout, def.TLSHandshakeTimeout},
		{"MaxIdleConns", tr.MaxIdleConns, 1024},
		{"MaxIdleConnsPerHost", tr.MaxIdleConnsPerHost, 256},
		{"IdleConnTimeout", tr.IdleConnTimeout, 90 * time.Second},
		// timeouts.response_header is timed per attempt (transport.try), so a reload applies it.
		{"ResponseHeaderTimeout", tr.ResponseHeaderTimeout, time.Duration(0)},
		{"ExpectContinueTimeout", tr.ExpectContinueTimeout, time.Second},
		{"DisableCompression", tr.DisableCompression, true},
		{"no proxy from the environment", tr.Proxy == nil, true},
		{"HTTP/1.1 to the replicas", tr.ForceAttemptHTTP2, false},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if tr.TLSHandshakeTimeout <= 0 {
		t.Errorf("TLSHandshakeTimeout %v: an https replica that stalls the handshake would hang the attempt", tr.TLSHandshakeTimeout)
	}
}
