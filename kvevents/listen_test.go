package kvevents

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// routeFunc is a Router from a function.
type routeFunc func(topic string, rank int) int

func (f routeFunc) Replica(topic string, rank int) int { return f(topic, rank) }

// podRoutes: replica 0 is the pod 10.0.0.1; replicas 1 and 2 are ranks 0
// and 1 of the data-parallel server on the pod 10.0.0.2.
var podRoutes = routeFunc(func(topic string, rank int) int {
	switch topic {
	case "kv@10.0.0.1@m":
		return 0
	case "kv@10.0.0.2@m":
		if rank == 0 || rank == 1 {
			return 1 + rank
		}
	}
	return -1
})

// startListener runs a Listener on 127.0.0.1 until the test ends.
func startListener(t *testing.T, opts ListenOptions) *Listener {
	t.Helper()
	if opts.Endpoints == nil {
		opts.Endpoints = []string{"tcp://127.0.0.1:0"}
	}
	l := NewListener(opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != context.Canceled {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
	})
	eventually(t, "bound", func() bool { return len(l.Status().Addresses) == len(opts.Endpoints) })
	return l
}

// connectPub is a Publisher that connects to ep, as vLLM's does with an
// endpoint without "*".
func connectPub(t *testing.T, ep, topic string) *Publisher {
	t.Helper()
	p, err := NewPublisher(PublisherOptions{Endpoint: ep, Connect: true, Topic: topic, Form: FormMap})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestListenConnectingPublishers: publishers that connect to the bound
// socket are told apart by topic and data-parallel rank; a topic no
// replica has is counted and its connection closed.
func TestListenConnectingPublishers(t *testing.T) {
	farm := NewFarm(3, 0, 0)
	l := startListener(t, ListenOptions{Router: podRoutes, Handlers: []Handler{farm.Replica(0), farm.Replica(1), farm.Replica(2)}})
	ep := l.Status().Addresses[0]
	pubs := []struct {
		p    *Publisher
		rank int
		hash uint64
	}{
		{connectPub(t, ep, "kv@10.0.0.1@m"), 0, 100},
		{connectPub(t, ep, "kv@10.0.0.2@m"), 0, 200},
		{connectPub(t, ep, "kv@10.0.0.2@m"), 1, 300},
		{connectPub(t, ep, "kv@6.6.6.6@m"), 0, 400},
	}
	// A PUB socket drops what it publishes before the subscription
	// reached it (ZeroMQ's slow joiner): publish until every replica has
	// its block.
	held := func() bool {
		for _, s := range farm.Snapshot() {
			if s.BlocksHeld == 0 {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(10 * time.Second)
	for !held() || l.Status().UnknownTopics == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("not every replica heard from: %+v, %+v", farm.Snapshot(), l.Status())
		}
		for _, p := range pubs {
			p.p.Publish(&Batch{TS: 1, DPRank: p.rank, Events: []Event{stored(p.hash)}})
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i, s := range farm.Snapshot() {
		if !s.Connected || s.Miss.Cold != 16 || s.Restarts != 0 {
			t.Errorf("replica %d: %+v, want connected, its one block cold, no restart", i, s)
		}
	}
	st := l.Status()
	if st.LastUnknownTopic != `"kv@6.6.6.6@m"` {
		t.Errorf("last unknown topic %s", st.LastUnknownTopic)
	}
	if st.Connections > 3+1 { // the unknown one may be back, about to be closed again
		t.Errorf("%d connections, want the three known publishers'", st.Connections)
	}
}

// TestListenBounds: a publisher stuck in its greeting does not hold up
// the others (each connection is served on its own, within the handshake
// time), connections beyond the cap are refused and counted, and an
// address that is taken is bound once it is free.
func TestListenBounds(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	farm := NewFarm(1, 0, 0)
	l := NewListener(ListenOptions{
		Endpoints: []string{"tcp://" + taken.Addr().String()}, Router: routeFunc(func(string, int) int { return 0 }),
		Handlers: []Handler{farm.Replica(0)}, MaxConns: 3, Retry: 10 * time.Millisecond,
		Limits: Limits{Handshake: time.Second},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	eventually(t, "told the address is taken", func() bool { return strings.Contains(l.Status().Error, "address already in use") })
	taken.Close()
	eventually(t, "bound", func() bool { return len(l.Status().Addresses) == 1 })
	ep := strings.TrimPrefix(l.Status().Addresses[0], "tcp://")

	// Two connections that send half a greeting hold two of three slots.
	for range 2 {
		c, err := net.Dial("tcp", ep)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, _ = c.Write(zmtpGreeting()[:10])
	}
	eventually(t, "two connections", func() bool { return l.Status().Connections == 2 })
	p := connectPub(t, "tcp://"+ep, "any")
	eventually(t, "the publisher heard", func() bool {
		p.Publish(&Batch{TS: 1, DPRank: 0, Events: []Event{stored(1)}})
		return farm.Snapshot()[0].BlocksHeld > 0
	})
	// The cap is reached: the next connection is closed at once.
	extra, err := net.Dial("tcp", ep)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	eventually(t, "refused", func() bool { return l.Status().Refused >= 1 })
	// The stuck ones are let go after the handshake time.
	eventually(t, "the stuck connections closed", func() bool { return l.Status().Connections == 1 })
}
