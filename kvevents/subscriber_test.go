package kvevents

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// TestSubscribeRestartAndReconnect: a publisher that restarts (its
// sequence back to 0) resets the ledger; a subscriber that starts before
// its publisher connects once it is up, and one that comes late gets the
// earlier batches by replay.
func TestSubscribeRestartAndReconnect(t *testing.T) {
	pub, err := NewPublisher(PublisherOptions{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Form: FormArray})
	if err != nil {
		t.Fatal(err)
	}
	// Batches published before anyone subscribed come by replay.
	pub.Publish(&Batch{DPRank: -1, Events: []Event{stored(1, 2)}})
	pub.Publish(&Batch{DPRank: -1, Events: []Event{stored(3)}})
	farm := NewFarm(1, 0, 0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Subscribe(ctx, SubscribeOptions{Endpoint: pub.Endpoint(), ReplayEndpoint: pub.ReplayEndpoint(), Retry: 20 * time.Millisecond}, farm.Replica(0))
	}()
	defer func() {
		cancel()
		if err := <-done; err != context.Canceled {
			t.Errorf("Subscribe returned %v, want context.Canceled", err)
		}
	}()
	wait := waiter(t, farm)
	s := wait("replayed the early batches", func(s ReplicaStatus) bool { return s.Batches == 2 })
	if s.BlocksHeld != 3 || !s.Complete {
		t.Fatalf("after replay: %+v, want 3 held, complete", s)
	}
	// A restarted engine: a new publisher on the same sockets, from seq 0.
	ep, rep := pub.Endpoint(), pub.ReplayEndpoint()
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	wait("told of the closed connection", func(s ReplicaStatus) bool { return !s.Connected })
	pub2, err := NewPublisher(PublisherOptions{Endpoint: ep, ReplayEndpoint: rep, Form: FormMap})
	if err != nil {
		t.Fatal(err)
	}
	defer pub2.Close()
	wait("reconnected", func(s ReplicaStatus) bool { return s.Connected })
	restarted := func(s ReplicaStatus) bool { return s.Restarts == 1 && s.BlocksHeld >= 1 }
	go func() {
		for ctx.Err() == nil && !restarted(farm.Snapshot()[0]) {
			pub2.Publish(&Batch{DPRank: -1, Events: []Event{stored(42)}})
			time.Sleep(20 * time.Millisecond)
		}
	}()
	s = wait("told of the restart", restarted)
	if s.Lost != 0 {
		t.Errorf("after the restart: %+v, want none lost", s)
	}
}

// waiter polls farm's replica 0 until ok holds, for at most 10 s.
func waiter(t *testing.T, farm *Farm) func(string, func(ReplicaStatus) bool) ReplicaStatus {
	return func(what string, ok func(ReplicaStatus) bool) ReplicaStatus {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			s := farm.Snapshot()[0]
			if ok(s) {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("not %s: %+v", what, s)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// TestSubscribeRestartCaughtUp: an engine that restarts while the
// subscriber is away and publishes as many batches as the subscriber had
// seen before it comes back continues the old numbering; the replay of
// the last batch seen tells it apart (CI once lost this race: the old
// check only looked for numbers running backwards).
func TestSubscribeRestartCaughtUp(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after int // batches the new engine publishes before the subscriber is back
	}{
		{"behind", 1},
		{"level", 2},
		{"ahead", 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pub, err := NewPublisher(PublisherOptions{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Form: FormArray})
			if err != nil {
				t.Fatal(err)
			}
			pub.Publish(&Batch{TS: 1, DPRank: -1, Events: []Event{stored(1, 2)}})
			pub.Publish(&Batch{TS: 2, DPRank: -1, Events: []Event{stored(3)}})
			farm := NewFarm(1, 0, 0)
			wait := waiter(t, farm)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				done <- Subscribe(ctx, SubscribeOptions{Endpoint: pub.Endpoint(), ReplayEndpoint: pub.ReplayEndpoint(), Retry: 300 * time.Millisecond}, farm.Replica(0))
			}()
			defer func() {
				cancel()
				<-done
			}()
			wait("replayed the first engine's batches", func(s ReplicaStatus) bool { return s.Batches == 2 })
			ep, rep := pub.Endpoint(), pub.ReplayEndpoint()
			if err := pub.Close(); err != nil {
				t.Fatal(err)
			}
			wait("told of the closed connection", func(s ReplicaStatus) bool { return !s.Connected })
			// The new engine publishes before the subscriber's retry.
			pub2, err := NewPublisher(PublisherOptions{Endpoint: ep, ReplayEndpoint: rep, Form: FormArray})
			if err != nil {
				t.Fatal(err)
			}
			defer pub2.Close()
			for i := range tc.after {
				pub2.Publish(&Batch{TS: float64(100 + i), DPRank: -1, Events: []Event{stored(uint64(100 + i))}})
			}
			s := wait("told of the restart", func(s ReplicaStatus) bool { return s.Restarts == 1 && s.BlocksHeld == int64(tc.after) })
			if s.Lost != 0 || s.LastSeq != uint64(tc.after-1) {
				t.Errorf("after the restart: %+v, want none lost, last seq %d", s, tc.after-1)
			}
		})
	}
}

// TestSubscribeRefusesHugeFrames: a peer that announces a frame of 1 TiB
// fails the connection before anything is allocated (zmq4 would allocate
// the frame at its declared size).
func TestSubscribeRefusesHugeFrames(t *testing.T) {
	huge := []byte{0x06, 0, 0, 1, 0, 0, 0, 0, 0} // command, long: 1 TiB
	p := startHostile(t, func(c net.Conn, _ int) { _, _ = c.Write(append(zmtpGreeting(), huge...)) })
	h := &recorder{}
	follow(t, p, Limits{}, h)
	eventually(t, "refused", func() bool {
		return strings.Contains(h.lastErr(), "a frame of 1099511627776 bytes, more than")
	})
}
