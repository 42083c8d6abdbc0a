package live

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/internal/fakevllm"
)

// TestAdminConnectionsCapped: the admin address, served by Serve (warden
// proxy) and by Run (warden epp), holds at most adminMaxConns connections
// and, over them, at most maxRefusing being refused: a flood of idle
// connections to it takes no more file descriptors than that. A GET
// /healthz over the bound is still answered as the admin handler answers
// it (a probe during a flood), any other request 503 with Retry-After.
// Before, the admin listener took every connection: the 164 of the flood
// held 164 descriptors until read_header's 10 s.
func TestAdminConnectionsCapped(t *testing.T) {
	for _, mode := range []string{"Serve", "Run"} {
		t.Run(mode, func(t *testing.T) {
			good := fakevllm.New(t, 1)
			admin := startAdmin(t, mode, modelsYAML("", urlsModel(good.URL())))
			base := openFDs(t)
			// The bound, filled with keep-alive connections that were
			// served (an idle one is kept adminIdle, 30 s).
			var conns []net.Conn
			for range adminMaxConns {
				c, res := adminGet(t, admin, "/healthz")
				if res == nil || res.StatusCode != http.StatusOK {
					t.Fatalf("a connection within the bound: %v", res)
				}
				conns = append(conns, c)
			}
			const flood = maxRefusing + 100
			for range flood {
				c, err := net.Dial("tcp", admin)
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, c)
			}
			defer func() {
				for _, c := range conns {
					c.Close()
				}
			}()
			// A probe is answered once a refusal's slot is free: every
			// connection of the flood has been accepted by then.
			res := adminAnswer(t, admin, "/healthz")
			if res.StatusCode != http.StatusOK || !res.Close {
				t.Errorf("/healthz over the bound: %d (close %v), want 200 ok and Connection: close", res.StatusCode, res.Close)
			}
			held := openFDs(t) - base - len(conns)
			t.Logf("%d connections to the admin address (%d of them idle, never a request): %d descriptors held by the server", len(conns), flood, held)
			if max := adminMaxConns + maxRefusing + 16; held > max { // 16: the scrapes' and the test's own
				t.Errorf("the server holds %d descriptors for %d admin connections; want at most %d (the bound and the refusals)", held, len(conns), max)
			}
			if res := adminAnswer(t, admin, "/api/status"); res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("Retry-After") != "1" {
				t.Errorf("/api/status over the bound: %d (Retry-After %q), want 503 with Retry-After: 1", res.StatusCode, res.Header.Get("Retry-After"))
			}
		})
	}
}

// startAdmin serves a server built from yamlText, by Serve or by Run,
// with its admin address on 127.0.0.1:0, until the test ends; it returns
// the admin address.
func startAdmin(t *testing.T, mode, yamlText string) string {
	t.Helper()
	if mode == "Serve" {
		return strings.TrimPrefix(startProxy(t, yamlText).admin, "http://")
	}
	cfg, err := ParseConfig("test.yaml", []byte("listen: 127.0.0.1:0\n"+yamlText))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(cfg, WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return ln.Addr().String()
}

// adminGet sends GET path on a new connection to addr and reads the
// answer; the connection stays open. A nil answer: the connection was
// closed without one.
func adminGet(t *testing.T, addr, path string) (net.Conn, *http.Response) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path)
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return c, nil
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	c.SetDeadline(time.Time{})
	return c, res
}

// adminAnswer sends GET path to addr on new connections until one is
// answered (one over the bound is closed at once while maxRefusing are
// being refused, each for at most refuseWait).
func adminAnswer(t *testing.T, addr, path string) *http.Response {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, res := adminGet(t, addr, path)
		c.Close()
		if res != nil {
			return res
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: never answered", path)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
