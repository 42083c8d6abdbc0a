package kvevents

import (
	"context"
	"encoding/binary"
	"io"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The tests of this file drive hand-written misbehaving publishers on
// 127.0.0.1: ZMTP written byte by byte, so that a publisher can send what
// no ZeroMQ library would (half a greeting, a message of ten thousand
// frames, numbers near 2^64).

// zmtpGreeting is a ZMTP 3.0 greeting with the NULL mechanism.
func zmtpGreeting() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:], "NULL")
	return g
}

// zmtpReady is the NULL handshake's READY command of a socket of type typ.
func zmtpReady(typ string) []byte {
	body := append([]byte{5}, "READY"...)
	body = append(body, byte(len("Socket-Type")))
	body = append(body, "Socket-Type"...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(typ)))
	body = append(body, typ...)
	return zmtpFrame(0x04, body)
}

// zmtpFrame is one frame: flags (0x01 MORE, 0x04 command) and body.
func zmtpFrame(flags byte, body []byte) []byte {
	if len(body) > 255 {
		return append(binary.BigEndian.AppendUint64([]byte{flags | 0x02}, uint64(len(body))), body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

// zmtpMessage is frames as one message.
func zmtpMessage(frames ...[]byte) []byte {
	var out []byte
	for i, f := range frames {
		var more byte
		if i < len(frames)-1 {
			more = 0x01
		}
		out = append(out, zmtpFrame(more, f)...)
	}
	return out
}

// batchMessage is vLLM's (topic, seq, payload) with a small valid batch.
func batchMessage(seq uint64, events ...Event) []byte {
	if events == nil {
		events = []Event{stored(seq + 1)}
	}
	payload := AppendBatch(nil, &Batch{TS: 1, DPRank: 0, Events: events}, FormMap)
	return zmtpMessage([]byte("kv"), binary.BigEndian.AppendUint64(nil, seq), payload)
}

// hostilePub accepts connections and plays script on each (n counts them
// from 1), reading and discarding what the subscriber sends.
type hostilePub struct {
	ln      net.Listener
	accepts atomic.Int32
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
}

func startHostile(t testing.TB, script func(c net.Conn, n int)) *hostilePub {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &hostilePub{ln: ln}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, c)
			p.mu.Unlock()
			n := int(p.accepts.Add(1))
			p.wg.Go(func() { _, _ = io.Copy(io.Discard, c) })
			p.wg.Go(func() { script(c, n) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *hostilePub) endpoint() string { return "tcp://" + p.ln.Addr().String() }

// follow subscribes h to p until the test ends.
func follow(t *testing.T, p *hostilePub, lim Limits, h Handler) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Subscribe(ctx, SubscribeOptions{Endpoint: p.endpoint(), Retry: 20 * time.Millisecond, Limits: lim}, h)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != context.Canceled {
			t.Errorf("Subscribe returned %v, want context.Canceled", err)
		}
	})
}

// eventually polls ok for up to 10 s (a deadlock detector, not a timing).
func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not %s after 10 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSubscribeBoundsMessages: a message is bounded in frames and in
// bytes, not only each frame: the connection fails, and says why, before
// the frames pile up (80 frames of 15 MiB, each under the frame bound,
// took the proxy to 1.27 GB; ten million empty frames to 450 MB).
func TestSubscribeBoundsMessages(t *testing.T) {
	const payload = 1 << 20
	lim := Limits{MaxPayload: payload}
	mib := make([]byte, 1<<20)
	cases := []struct {
		name   string
		frames [][]byte
		want   string
	}{
		{"80 frames of 64 KiB", repeat(mib[:64<<10], 80), "a message of more than 4 frames"},
		{"3 frames adding up past the bound", repeat(mib[:512<<10], 3), "a message of more than 1052672 bytes"},
		{"10000 empty frames", repeat(nil, 10000), "a message of more than 4 frames"},
		{"a frame over the bound", [][]byte{make([]byte, payload+8192)}, "a frame of 1056768 bytes, more than 1052672"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			msg := zmtpMessage(tc.frames...)
			p := startHostile(t, func(c net.Conn, _ int) {
				_, _ = c.Write(append(zmtpGreeting(), zmtpReady("PUB")...))
				_, _ = c.Write(msg)
			})
			h := &recorder{}
			follow(t, p, lim, h)
			eventually(t, "refused", func() bool { return strings.Contains(h.lastErr(), tc.want) })
		})
	}
}

func repeat(b []byte, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}

// TestSubscribeTimesEveryPhase: a publisher that stops halfway through
// the greeting, the handshake or a message is dropped after the phase's
// time and dialled again; the status says what it was waiting for (it
// used to stay stuck, shown as connected).
func TestSubscribeTimesEveryPhase(t *testing.T) {
	lim := Limits{Handshake: 100 * time.Millisecond, Message: 100 * time.Millisecond}
	cases := []struct {
		name string
		send []byte
		want string
	}{
		{"half a greeting", zmtpGreeting()[:30], "the ZMTP greeting (30 of 64 bytes came)"},
		{"greeting, no READY", zmtpGreeting(), "the ZMTP handshake"},
		{"half a READY", append(zmtpGreeting(), zmtpReady("PUB")[:5]...), "the ZMTP handshake"},
		{"half a frame", append(append(zmtpGreeting(), zmtpReady("PUB")...), zmtpFrame(0, make([]byte, 100))[:12]...),
			"the rest of a message (1 frames, 100 bytes came)"},
		{"a message without its last frame", append(append(zmtpGreeting(), zmtpReady("PUB")...), zmtpFrame(1, []byte("kv"))...),
			"the rest of a message (1 frames, 2 bytes came)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := startHostile(t, func(c net.Conn, _ int) { _, _ = c.Write(tc.send) })
			h := &recorder{}
			follow(t, p, lim, h)
			eventually(t, "dialled again", func() bool { return p.accepts.Load() >= 3 })
			if err := h.lastErr(); !strings.Contains(err, tc.want) {
				t.Errorf("status error %q, want it to name %q", err, tc.want)
			}
		})
	}
}

// TestSubscribeSequenceJumps: counters never go negative, whatever the
// numbers; a jump far ahead is a restart, not a gap of 2^64 batches; a
// subscriber that comes late loses nothing that was published before it;
// the replay's end marker is no batch.
func TestSubscribeSequenceJumps(t *testing.T) {
	const top = math.MaxUint64
	cases := []struct {
		name     string
		seqs     []uint64
		lost     int64
		restarts int64
		batches  int64
		bad      int64
	}{
		{"a gap", []uint64{0, 1, 5}, 3, 0, 3, 0},
		{"near 2^64", []uint64{0, 1, top - 1}, 0, 1, 3, 0},
		{"first batch near 2^64", []uint64{top - 2, top - 1}, 0, 0, 2, 0},
		{"the end marker", []uint64{0, top}, 0, 0, 1, 1},
		{"back to 0", []uint64{7, 8, 0, 1}, 0, 1, 4, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := startHostile(t, func(c net.Conn, n int) {
				if n > 1 {
					return
				}
				_, _ = c.Write(append(zmtpGreeting(), zmtpReady("PUB")...))
				for _, s := range tc.seqs {
					_, _ = c.Write(batchMessage(s))
				}
			})
			farm := NewFarm(1, 0, 0)
			follow(t, p, Limits{}, farm.Replica(0))
			s := waiter(t, farm)("every batch counted", func(s ReplicaStatus) bool { return s.Batches+s.Undecodable == tc.batches+tc.bad })
			if s.Lost != tc.lost || s.Restarts != tc.restarts || s.Batches != tc.batches || s.Undecodable != tc.bad {
				t.Errorf("%+v: want lost %d, restarts %d, batches %d, undecodable %d", s, tc.lost, tc.restarts, tc.batches, tc.bad)
			}
		})
	}
}

// TestSubscribeBoundsWork: a publisher that floods is held to the bound on
// batches and on block hashes per second; what is dropped is counted,
// shown, and lost (the ledger says it is incomplete), and the connection
// stays up.
func TestSubscribeBoundsWork(t *testing.T) {
	many := make([]uint64, 1000)
	for i := range many {
		many[i] = uint64(i + 1)
	}
	cases := []struct {
		name    string
		lim     Limits
		n       int
		events  []Event
		maxKept int64 // the bucket's burst plus what refills while the test runs
		what    string
	}{
		{"batches", Limits{BatchesPerSecond: 50}, 20_000, nil, replayBurst + 1000, "batches"},
		{"block hashes", Limits{HashesPerSecond: 5000}, 200, []Event{stored(many...)}, 5 + 20, "block hashes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var flood []byte
			for i := range tc.n {
				flood = append(flood, batchMessage(uint64(i), tc.events...)...)
			}
			p := startHostile(t, func(c net.Conn, n int) {
				if n == 1 {
					_, _ = c.Write(append(zmtpGreeting(), zmtpReady("PUB")...))
					_, _ = c.Write(flood)
				}
			})
			farm := NewFarm(1, 0, 0)
			follow(t, p, tc.lim, farm.Replica(0))
			s := waiter(t, farm)("every batch counted", func(s ReplicaStatus) bool { return s.Batches+s.Dropped == int64(tc.n) })
			if s.Dropped < int64(tc.n)-tc.maxKept || s.Lost != s.Dropped || s.Complete || !s.Connected {
				t.Errorf("%+v: want at least %d of %d dropped, each lost, incomplete, still connected", s, int64(tc.n)-tc.maxKept, tc.n)
			}
			if want := "over the bound on " + tc.what + " per second"; s.LastDrop != want {
				t.Errorf("last_drop %q, want %q", s.LastDrop, want)
			}
		})
	}
}

// TestSnapshotTakesNoLock: /api/status reads the farm while a batch is
// being counted under the farm's lock (a batch of 1.7 million hashes held
// it, and /api/status, for 2.2 s).
func TestSnapshotTakesNoLock(t *testing.T) {
	f := NewFarm(2, 0, 0)
	f.Replica(0).Batch(0, &Batch{Events: []Event{stored(1, 2, 3)}})
	f.mu.Lock() // a batch being counted
	got := make(chan []ReplicaStatus, 1)
	go func() { got <- f.Snapshot() }()
	select {
	case s := <-got:
		f.mu.Unlock()
		if s[0].BlocksHeld != 3 {
			t.Errorf("snapshot %+v, want the 3 blocks held", s[0])
		}
	case <-time.After(10 * time.Second):
		f.mu.Unlock()
		<-got
		t.Error("Snapshot waited for the lock")
	}
}

// recorder is a Handler that keeps the last connection error.
type recorder struct {
	mu  sync.Mutex
	err string
}

func (*recorder) Batch(uint64, *Batch)      {}
func (*recorder) Lost(uint64, uint64)       {}
func (*recorder) Dropped(uint64, string)    {}
func (*recorder) Restarted()                {}
func (*recorder) Undecodable(uint64, error) {}
func (r *recorder) Status(_ bool, err error) {
	if err != nil {
		r.mu.Lock()
		r.err = err.Error()
		r.mu.Unlock()
	}
}

func (r *recorder) lastErr() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// FuzzLimitedConnScan: the ZMTP stream scanner never panics, whatever the
// bytes and however they are cut, and what it lets pass keeps within the
// bounds: no message of more than maxFrames frames or max bytes.
func FuzzLimitedConnScan(f *testing.F) {
	f.Add(append(append(zmtpGreeting(), zmtpReady("PUB")...), batchMessage(3)...), uint8(7))
	f.Add(append(zmtpGreeting(), zmtpMessage(repeat(nil, 10)...)...), uint8(1))
	f.Add(append(zmtpGreeting(), 0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff), uint8(3))
	f.Fuzz(func(t *testing.T, stream []byte, cut uint8) {
		c := &limitedConn{max: 1024, greet: 64}
		step := int(cut%16) + 1
		for len(stream) > 0 {
			k := min(step, len(stream))
			if err := c.scan(stream[:k]); err != nil {
				return
			}
			if c.frames > maxFrames || c.bytes > c.max {
				t.Fatalf("let through %d frames, %d bytes", c.frames, c.bytes)
			}
			stream = stream[k:]
		}
	})
}

// TestWriteStallFails: after the handshake a write to a publisher that
// reads nothing (zmq4 answers each PING with a PONG: a peer that sends
// PINGs and never reads fills the socket's buffer) fails after the
// message time instead of holding the connection forever, shown connected.
func TestWriteStallFails(t *testing.T) {
	ours, theirs := net.Pipe() // unbuffered: a write waits for a read that never comes
	defer theirs.Close()
	c := &limitedConn{Conn: ours, msgTimeout: 100 * time.Millisecond}
	done := make(chan error, 1)
	go func() {
		_, err := c.Write([]byte("PONG"))
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "reads nothing") {
			t.Errorf("write: %v, want the stall named", err)
		}
	case <-time.After(10 * time.Second):
		theirs.Close()
		<-done
		t.Error("the write to a publisher that reads nothing never ended")
	}
}
