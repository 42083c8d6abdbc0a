package live

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/emulator"
	"github.com/lm-warden/warden/internal/fakevllm"
	"github.com/lm-warden/warden/kvevents"
)

// startKVEmulator serves a two-replica emulated farm that publishes KV
// events in form until the test ends; it returns the replicas' URLs and
// their PUB and replay endpoints.
func startKVEmulator(t *testing.T, form kvevents.Form) (urls, pubs, replays []string) {
	t.Helper()
	e, urls := serveEmulator(t, "model: "+emulatedModel+"\ngpu: RTX A4000\nreplicas: 2\nvllm: {max_num_seqs: 32, max_model_len: 32768}\n",
		emulator.Options{Speed: 1000, Seed: 1, KVEvents: emulator.KVEventsOptions{Form: form, Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"}})
	pubs, replays = e.KVEndpoints()
	return urls, pubs, replays
}

// TestStatusKVEvents: with kv_events, /api/status shows per replica the
// blocks its prefix cache holds, from the emulator's events in each wire
// form: the conversation's home holds its blocks (all computed cold), the
// other replica none; a second conversation with the same system prompt
// placed on the other replica computes the shared prefix there, which
// counts as elsewhere.
func TestStatusKVEvents(t *testing.T) {
	for _, form := range kvevents.Forms {
		t.Run(form.String(), func(t *testing.T) {
			urls, pubs, replays := startKVEmulator(t, form)
			h := startKVProxy(t, urls, pubs, replays, "")
			system := strings.Repeat("You are a careful coding agent. ", 60)
			body := func(user string) string {
				return fmt.Sprintf(`{"model":%q,"max_tokens":20,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, emulatedModel, system, user)
			}
			for i, s := range []string{"one", "two"} {
				if r := h.do("POST", "/v1/chat/completions", body("question of "+s), sessionHdr(s)); r.status != 200 {
					t.Fatalf("conversation %d: %d %s", i, r.status, r.body)
				}
			}
			st := h.waitFor("both replicas holding blocks, their request counted", func(r StatusReport) bool {
				for _, rs := range r.Models[0].Replicas {
					// The events may arrive before the proxy has counted the
					// request that caused them.
					if rs.KVEvents == nil || rs.KVEvents.BlocksHeld == 0 || rs.Requests == 0 {
						return false
					}
				}
				return true
			}).Models[0]
			var cold, elsewhere int64
			for i, rs := range st.Replicas {
				kv := rs.KVEvents
				if !kv.Complete || kv.Lost != 0 || rs.Requests != 1 {
					t.Errorf("replica %d: %+v, %d requests; want complete, none lost, one request each", i, kv, rs.Requests)
				}
				cold += kv.Miss.Cold
				elsewhere += kv.Miss.Elsewhere
			}
			if elsewhere < int64(len(system))/4/2 {
				t.Errorf("elsewhere %d tokens: the second replica recomputed the shared system prompt (~%d tokens)", elsewhere, len(system)/4)
			}
			if cold == 0 {
				t.Errorf("no cold tokens")
			}
		})
	}
}

// TestReloadKVEventsOnly: a reload that changes only a model's kv_events
// (here the publishers' endpoints, as a replica's vLLM moved its
// kv_events_config to another port) follows the new publishers; the
// model's sessions keep their homes and a stream running across the
// reload keeps its in-flight count, as any reload that replaces a model.
// Before, the model was kept as it was, still subscribed to the old
// endpoints.
func TestReloadKVEventsOnly(t *testing.T) {
	pubs := make([]*kvevents.Publisher, 4)
	for i := range pubs {
		p, err := kvevents.NewPublisher(kvevents.PublisherOptions{Endpoint: "tcp://127.0.0.1:0", Topic: "kv"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		pubs[i] = p
	}
	a, b := fakevllm.New(t, 1), fakevllm.New(t, 1)
	b.Hold = make(chan struct{})
	kv := func(p, q *kvevents.Publisher) string {
		return "    kv_events:\n      endpoints: [" + p.Endpoint() + ", " + q.Endpoint() + "]\n"
	}
	h := startProxy(t, modelsYAML("", urlsModel(a.URL(), b.URL())+kv(pubs[0], pubs[1])))
	h.scraped()
	connected := func(r StatusReport) bool {
		for _, rs := range r.Models[0].Replicas {
			if rs.KVEvents == nil || !rs.KVEvents.Connected {
				return false
			}
		}
		return true
	}
	h.waitFor("subscribed to the first publishers", connected)
	// A conversation homed on a, a stream of another running on b.
	if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "w", 0, false), sessionHdr("w")); r.status != 200 {
		t.Fatalf("first turn: %d %s", r.status, r.body)
	}
	got := h.doAsync("/v1/chat/completions", chatBody(testModel, "s", 0, true), sessionHdr("s"))
	h.waitFor("the stream on b", func(st StatusReport) bool { return b.Hits.Load() == 1 && st.Models[0].InFlight == 1 })

	h.reload(modelsYAML("", urlsModel(a.URL(), b.URL())+kv(pubs[2], pubs[3])))
	st := h.status().Models[0]
	if st.Sessions != 2 || st.Replicas[1].InFlight != 1 {
		t.Errorf("after the reload: %d sessions, %d in flight on b; want both sessions kept and the stream counted", st.Sessions, st.Replicas[1].InFlight)
	}
	// Only the new publishers publish: each replica hears its own.
	deadline := time.Now().Add(10 * time.Second)
	for r := h.status(); ; r = h.status() {
		m := r.Models[0]
		if m.Replicas[0].KVEvents.BlocksHeld > 0 && m.Replicas[1].KVEvents.BlocksHeld > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new publishers were never heard (the model still follows the old endpoints): %+v, %+v", m.Replicas[0].KVEvents, m.Replicas[1].KVEvents)
		}
		for i, p := range pubs[2:] {
			p.Publish(&kvevents.Batch{TS: 1, Events: []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: []uint64{uint64(10 + i)}, BlockSize: 16}}})
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "w", 1, false), sessionHdr("w")); r.status != 200 || a.Hits.Load() != 2 {
		t.Errorf("the next turn of the conversation homed on a: %d, a served %d; want it home", r.status, a.Hits.Load())
	}
	close(b.Hold)
	if r := <-got; r.status != 200 || !strings.HasSuffix(r.body, "data: [DONE]\n\n") {
		t.Fatalf("the stream across the reload: %d %q", r.status, r.body)
	}
	h.waitFor("the stream's count given back", func(st StatusReport) bool {
		return st.Models[0].InFlight == 0 && st.Models[0].Replicas[1].InFlight == 0
	})
}
