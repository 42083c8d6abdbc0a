package live

import (
	"context"
	"reflect"
	"sync"
	"sync/atomic"

	"github.com/lm-warden/warden/kvevents"
	"github.com/lm-warden/warden/traces"
)

// kvFollower follows a model's KV events (kv_events): one kvevents
// subscriber goroutine per replica, or one listener that the replicas'
// publishers connect to, feeding one kvevents.Farm, which /api/status
// reads. It lives from the model's start to its stop; a reload's
// successor subscribes afresh (the publishers' replay buffers give it
// back what they kept) or binds the listen address once its predecessor
// let it go.
type kvFollower struct {
	farm   *kvevents.Farm
	listen *kvevents.Listener // listen mode; nil when the proxy dials
	wg     sync.WaitGroup
}

// startKV follows every replica's events when kv_events is set.
func (m *model) startKV(ctx context.Context) {
	c := &m.cfg.KVEvents
	if !c.On() {
		return
	}
	f := &kvFollower{farm: kvevents.NewFarm(len(m.replicas), c.MaxBlocks, 0)}
	handlers := make([]kvevents.Handler, f.farm.Len())
	for i := range handlers {
		handlers[i] = f.farm.Replica(i)
	}
	if c.Listen != "" {
		eps, err := c.listenEndpoints("models", m.cfg.kvRanks())
		if err != nil { // checked by the config's resolve
			return
		}
		hosts := make([]string, len(m.replicas))
		for i, r := range m.replicas {
			hosts[i] = r.target.Host
		}
		f.listen = kvevents.NewListener(kvevents.ListenOptions{
			Endpoints: eps, Topic: c.Topic, Router: newKVRoutes(c.Topics, hosts), Handlers: handlers,
			MaxConns: c.MaxPublishers, Limits: c.limits(),
		})
		f.wg.Go(func() { _ = f.listen.Run(ctx) })
		m.kv.Store(f)
		return
	}
	pubs, replays, err := c.endpoints("models", len(m.replicas))
	if err != nil { // checked by the config's resolve
		return
	}
	for i := range min(len(pubs), len(handlers)) {
		opts := kvevents.SubscribeOptions{Endpoint: pubs[i], ReplayEndpoint: replays[i], Topic: c.Topic, Limits: c.limits()}
		h := handlers[i]
		f.wg.Go(func() { _ = kvevents.Subscribe(ctx, opts, h) })
	}
	m.kv.Store(f)
}

// stopKV waits for the subscribers, whose context the model's stop
// cancelled.
func (m *model) stopKV() {
	if f := m.kv.Load(); f != nil {
		f.wg.Wait()
	}
}

// kvHeld is a model's placement.HeldIndex (routing prefix: held): how many
// leading blocks of a prompt each replica holds, from the KV events'
// ledgers. A prompt's blocks are the canonical-text blocks of
// traces/text.go (call.fillPrompt), 16 tokens each; an engine block of
// block_size B (vllm:cache_config_info; 16 when unknown) is B/16 of them,
// its id the id of its last (as the emulator's regroup names them).
//
// vLLM hashes the token ids of a block (sha256 or xxhash of the parent's
// hash, the tokens and extra keys, seeded by PYTHONHASHSEED), which a
// proxy that does not tokenize cannot compute; llm-d's precise mode runs
// the model's tokenizer in a sidecar (vLLM's chat-template renderer) and
// re-hashes the token_ids each BlockStored carries (llm-d-kv-cache
// pkg/kvevents/pool.go, kvblock/token_processor.go). warden does not
// tokenize, so against vLLM no block of ours is ever found and the index
// says it cannot tell (matched stays false): the prefix rules then change
// nothing. Against `warden emulate --kv-events`, whose engines hash the
// same canonical text with traces.EmulatorBlockKey, the ids are exact.
type kvHeld struct {
	m       *model
	matched atomic.Bool // a prompt block was found in some ledger
	ids     []uint64    // scratch, guarded by the model's mu (Pick holds it)
}

// Held implements placement.HeldIndex.
func (h *kvHeld) Held(blocks []uint64, blockTokens int, dst []int) ([]int, bool) {
	f := h.m.kv.Load()
	if f == nil || blockTokens <= 0 {
		return dst, false
	}
	n0, found := len(dst), false
	for i, rep := range h.m.replicas {
		bs := traces.TextBlockTokens
		if st, ok := rep.stats(rep.server.last.Load()); ok && st.BlockSize > 0 {
			bs = st.BlockSize
		}
		if bs%blockTokens != 0 {
			return dst[:n0], false
		}
		per := bs / blockTokens
		h.ids = h.ids[:0]
		for k := per - 1; k < len(blocks); k += per {
			h.ids = append(h.ids, blocks[k])
		}
		n, ok := f.farm.Leading(i, h.ids)
		if !ok {
			return dst[:n0], false
		}
		found = found || n > 0
		dst = append(dst, n*per)
	}
	if found {
		h.matched.Store(true)
	}
	if !h.matched.Load() {
		return dst[:n0], false
	}
	return dst, true
}

// sameKVEvents reports whether o follows the KV events m follows, every
// key of kv_events alike. A reload that changes any replaces the model
// (Server.build): its successor subscribes, or binds, afresh, with the
// sessions and in-flight counts handed over.
func (m *model) sameKVEvents(o ModelCfg) bool { return reflect.DeepEqual(m.cfg.KVEvents, o.KVEvents) }

// kvStatus is replica i's KV-events state, nil without kv_events.
func (m *model) kvStatus(all []kvevents.ReplicaStatus, i int) *kvevents.ReplicaStatus {
	if i >= len(all) {
		return nil
	}
	return &all[i]
}
