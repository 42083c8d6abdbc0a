package live

import (
	"context"
	"reflect"
	"sync"

	"github.com/lm-warden/warden/kvevents"
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
