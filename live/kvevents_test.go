package live

import (
	"fmt"
	"strings"
	"testing"

	"github.com/lm-warden/warden/emulator"
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
