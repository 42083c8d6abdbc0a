package live

import (
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
)

// BenchmarkBodyRelay is why the proxy reads a body whole before it sends
// it (issue 13, item 12): a request of size bytes goes client -> relay ->
// backend on loopback and a byte comes back, with the relay waiting for
// the whole body (store) or passing on each read as it comes (through:
// reads of whatever has come; through-64K, -16K: reads of at most that,
// as HAProxy's buffers do). On loopback a client's write is in the
// relay's socket at once, so cutting through has nothing to overlap, and
// smaller reads only add syscalls and wake-ups. On a 2-core VM, 256 KiB:
// direct 41 µs, store 79, through 75, through-64K 100, through-16K 220
// (-count 4, 2026-12-04).
func BenchmarkBodyRelay(b *testing.B) {
	for _, size := range []int{64 << 10, 256 << 10} {
		for _, tc := range []struct {
			name  string
			relay bool
			store bool
			chunk int
		}{
			{"direct", false, false, 0},
			{"store", true, true, 0},
			{"through", true, false, 0},
			{"through-64K", true, false, 64 << 10},
			{"through-16K", true, false, 16 << 10},
		} {
			b.Run(fmt.Sprintf("%dK/%s", size>>10, tc.name), func(b *testing.B) {
				benchRelay(b, size, tc.relay, tc.store, tc.chunk)
			})
		}
	}
}

func benchRelay(b *testing.B, size int, relay, store bool, chunk int) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	var lns []net.Listener
	keep := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	serve := func(ln net.Listener, handle func(net.Conn)) {
		wg.Go(func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				keep(c)
				wg.Go(func() { handle(c) })
			}
		})
	}
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		lns = append(lns, ln)
		return ln
	}
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	backend := listen()
	serve(backend, func(c net.Conn) {
		buf := make([]byte, size)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			if _, err := c.Write([]byte{1}); err != nil {
				return
			}
		}
	})
	backendAddr := backend.Addr().String()
	target := backendAddr
	if relay {
		ln := listen()
		serve(ln, func(c net.Conn) {
			up, err := net.Dial("tcp", backendAddr)
			if err != nil {
				return
			}
			keep(up)
			buf, one := make([]byte, size), make([]byte, 1)
			for {
				if store {
					if _, err := io.ReadFull(c, buf); err != nil {
						return
					}
					if _, err := up.Write(buf); err != nil {
						return
					}
				} else {
					for got := 0; got < size; {
						end := size
						if chunk > 0 {
							end = min(size, got+chunk)
						}
						n, err := c.Read(buf[got:end])
						if err != nil {
							return
						}
						if _, err := up.Write(buf[got : got+n]); err != nil {
							return
						}
						got += n
					}
				}
				if _, err := io.ReadFull(up, one); err != nil {
					return
				}
				if _, err := c.Write(one); err != nil {
					return
				}
			}
		})
		target = ln.Addr().String()
	}
	c, err := net.Dial("tcp", target)
	if err != nil {
		b.Fatal(err)
	}
	body, one := make([]byte, size), make([]byte, 1)
	b.SetBytes(int64(size))
	for b.Loop() {
		if _, err := c.Write(body); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, one); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	c.Close()
}
