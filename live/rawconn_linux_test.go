package live

import (
	"bytes"
	"fmt"
	"github.com/lm-warden/warden/live/upstream"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestClientConnArrivals: a handler of the clients' server (as Serve
// makes it, on a rawListener) can tell how much of a body has arrived, so
// that ReadBody takes one buffer for a body that came with its head.
func TestClientConnArrivals(t *testing.T) {
	cfg, err := ParseConfig("t.yaml", []byte("listen: 127.0.0.1:0\n"+modelsYAML("", urlsModel("http://127.0.0.1:1"))))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := srv.clientServer(srv.state.Load().cfg)
	got := make(chan int, 1)
	hs.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := connArrivals(r)
		if a == nil {
			got <- -1
			return
		}
		got <- a.Queued()
		_, _ = io.Copy(io.Discard, r.Body)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = hs.Serve(rawListener{ln}) }()
	t.Cleanup(func() { _ = hs.Close() })
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := bytes.Repeat([]byte("x"), 60<<10)
	req := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-got:
		// net/http's read buffer holds up to 4 KiB of the body; the rest
		// waits in the socket.
		if n < len(body)-upstream.HeadSlack || n > len(body) {
			t.Errorf("the handler saw %d bytes queued, want the body's %d less net/http's buffer", n, len(body))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no request reached the handler")
	}
}

// rawListener gives a listener's connections as the proxy's listener
// does (upstream.WrapClient), owned by no clientListener.
type rawListener struct{ net.Listener }

func (l rawListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return upstream.WrapClient(c, noOwner{}), nil
}

// noOwner counts nothing and bounds no write.
type noOwner struct{}

func (noOwner) Release()                    {}
func (noOwner) WriteTimeout() time.Duration { return 0 }
func (noOwner) WriteTimedOut()              {}
