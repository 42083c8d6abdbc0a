package live

import (
	"context"
	"sync"

	"github.com/lm-warden/warden/kvevents"
)

// kvFollower follows a model's KV events (kv_events): one kvevents
// subscriber goroutine per replica feeding one kvevents.Farm, which
// /api/status reads. It lives from the model's start to its stop; a
// reload's successor subscribes afresh (the publishers' replay buffers
// give it back what they kept).
type kvFollower struct {
	farm *kvevents.Farm
	wg   sync.WaitGroup
}

// startKV subscribes to every replica's events when kv_events is set.
func (m *model) startKV(ctx context.Context) {
	c := &m.cfg.KVEvents
	if !c.On() {
		return
	}
	pubs, replays, err := c.endpoints("models", len(m.replicas))
	if err != nil { // checked by the config's resolve
		return
	}
	f := &kvFollower{farm: kvevents.NewFarm(len(m.replicas), c.MaxBlocks, 0)}
	for i := range min(len(pubs), f.farm.Len()) {
		opts := kvevents.SubscribeOptions{Endpoint: pubs[i], ReplayEndpoint: replays[i], Topic: c.Topic}
		h := f.farm.Replica(i)
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

// kvStatus is replica i's KV-events state, nil without kv_events.
func (m *model) kvStatus(all []kvevents.ReplicaStatus, i int) *kvevents.ReplicaStatus {
	if i >= len(all) {
		return nil
	}
	return &all[i]
}
