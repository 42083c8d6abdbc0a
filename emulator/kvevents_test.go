package emulator

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/kvevents"
)

// follow subscribes a kvevents.Farm to every engine of r until the test
// ends.
func follow(t *testing.T, r *running, replay bool) *kvevents.Farm {
	t.Helper()
	pubs, replays := r.e.KVEndpoints()
	if pubs == nil {
		t.Fatal("the emulator publishes no KV events")
	}
	farm := kvevents.NewFarm(len(pubs), 0, 0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, len(pubs))
	for i := range pubs {
		opts := kvevents.SubscribeOptions{Endpoint: pubs[i], Retry: 50 * time.Millisecond}
		if replay {
			opts.ReplayEndpoint = replays[i]
		}
		go func() {
			_ = kvevents.Subscribe(ctx, opts, farm.Replica(i))
			done <- struct{}{}
		}()
	}
	t.Cleanup(func() {
		cancel()
		for range pubs {
			<-done
		}
	})
	waitFor(t, farm, "connected", func(s kvevents.ReplicaStatus) bool { return s.Connected })
	return farm
}

// waitFor polls replica 0's status until ok, for at most 10 s.
func waitFor(t *testing.T, farm *kvevents.Farm, what string, ok func(kvevents.ReplicaStatus) bool) kvevents.ReplicaStatus {
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

// TestKVEventsEndToEnd: the emulator's publisher, in each wire form, and
// the subscriber agree on what the replica's prefix cache holds, a batch
// the publisher did not send is replayed, and without a replay socket it
// is counted lost.
func TestKVEventsEndToEnd(t *testing.T) {
	system := strings.Repeat("Shared system prompt for agents. ", 40)
	for _, form := range kvevents.Forms {
		for _, replay := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s replay=%v", form, replay), func(t *testing.T) {
				kv := KVEventsOptions{Form: form, Endpoint: "tcp://127.0.0.1:0"}
				if replay {
					kv.ReplayEndpoint = "tcp://127.0.0.1:0"
				}
				r := start(t, testFarm(t, 1, ""), Options{KVEvents: kv})
				farm := follow(t, r, replay)

				user := "First question. " + strings.Repeat("context ", 300)
				first := ask(t, r.urls[0], "/v1/chat/completions", chatBody(system, []string{user}, nil, 100, false))
				want1 := int64((first.promptTokens + first.outputTokens - 1) / 16)
				s := waitFor(t, farm, "holding the first turn", func(s kvevents.ReplicaStatus) bool { return s.BlocksHeld >= want1 })
				if s.BlocksHeld != want1 || !s.Complete || s.Miss.Cold != want1*16 || s.WireForm != form.String() {
					t.Fatalf("after turn 1: %+v, want %d blocks held, complete, all cold, in the %s form", s, want1, form)
				}

				r.e.KVPublisher(0).DropNext() // the second turn's first batch never goes out
				second := ask(t, r.urls[0], "/v1/chat/completions", chatBody(system, []string{user, "And then?"}, []string{first.text}, 40, false))
				want2 := int64((second.promptTokens + second.outputTokens - 1) / 16)
				if replay {
					s = waitFor(t, farm, "holding the second turn", func(s kvevents.ReplicaStatus) bool { return s.BlocksHeld >= want2 })
					if s.BlocksHeld != want2 || !s.Complete || s.Lost != 0 || s.Batches != int64(s.LastSeq)+1 {
						t.Errorf("after turn 2 with a gap replayed: %+v, want %d blocks held, complete, none lost", s, want2)
					}
					return
				}
				s = waitFor(t, farm, "told of the gap", func(s kvevents.ReplicaStatus) bool { return s.Lost > 0 })
				if s.Lost != 1 || s.Complete || s.BlocksHeld >= want2 {
					t.Errorf("after turn 2 with a gap and no replay: %+v, want 1 batch lost, incomplete, fewer than %d blocks", s, want2)
				}
			})
		}
	}
}
