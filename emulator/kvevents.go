package emulator

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/lm-warden/warden/kvevents"
	"github.com/lm-warden/warden/sim"
)

// KVEventsOptions make every engine publish vLLM's KV-cache events
// (--kv-events-config in vLLM; package kvevents has the wire format):
// engine k binds Endpoint's port + k and ReplayEndpoint's port + k, as
// vLLM's ZmqEventPublisher.offset_endpoint_port does for data-parallel
// rank k. Port 0 gives each engine a port of the system's choosing.
type KVEventsOptions struct {
	Form           kvevents.Form // 0: no events
	Endpoint       string        // tcp://host:port; default tcp://127.0.0.1:5557
	ReplayEndpoint string        // "": no replay socket
	Topic          string
}

// kvPublisher turns one engine's cache changes (sim.CacheWatch) into
// batches: the blocks cached and evicted during one Advance make one
// KVEventBatch (vLLM sends one per engine step; an Advance ends one step
// or several), a chain of stored blocks one BlockStored. The token ids,
// which the emulator does not have, are derived from each block's hash.
type kvPublisher struct {
	pub       *kvevents.Publisher
	rank      int
	blockSize int
	batch     kvevents.Batch
	last      uint64 // hash of the last block stored in this batch
}

func newKVPublisher(o KVEventsOptions, rank, blockSize int) (*kvPublisher, error) {
	ep, err := offsetPort(o.Endpoint, rank)
	if err != nil {
		return nil, err
	}
	rep := ""
	if o.ReplayEndpoint != "" {
		if rep, err = offsetPort(o.ReplayEndpoint, rank); err != nil {
			return nil, err
		}
	}
	pub, err := kvevents.NewPublisher(kvevents.PublisherOptions{Endpoint: ep, ReplayEndpoint: rep, Topic: o.Topic, Form: o.Form})
	if err != nil {
		return nil, err
	}
	p := &kvPublisher{pub: pub, rank: rank, blockSize: blockSize}
	p.batch.Reset()
	return p, nil
}

// offsetPort adds rank to the port of a tcp:// endpoint (0 stays 0).
func offsetPort(ep string, rank int) (string, error) {
	addr, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", fmt.Errorf("kv events endpoint %q: want tcp://host:port", ep)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("kv events endpoint %q: %w", ep, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p+rank > 65535 {
		return "", fmt.Errorf("kv events endpoint %q: bad port", ep)
	}
	if p > 0 {
		p += rank
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(p)), nil
}

func (p *kvPublisher) watch() *sim.CacheWatch {
	return &sim.CacheWatch{Stored: p.stored, Removed: p.removed}
}

func (p *kvPublisher) stored(hash, parent uint64, hasParent bool) {
	evs := p.batch.Events
	if n := len(evs); n > 0 && evs[n-1].Kind == kvevents.BlockStored && hasParent && parent == p.last {
		e := &evs[n-1]
		e.BlockHashes = append(e.BlockHashes, hash)
		e.TokenIDs = appendTokens(e.TokenIDs, hash, p.blockSize)
		e.ExtraKeys = true
	} else {
		p.batch.Events = append(evs, kvevents.Event{
			Kind: kvevents.BlockStored, BlockHashes: []uint64{hash}, ParentBlockHash: parent, HasParent: hasParent,
			TokenIDs: appendTokens(nil, hash, p.blockSize), BlockSize: p.blockSize,
			Medium: kvevents.MediumGPU, GroupIdx: 0, CacheSpecKind: "full_attention", ExtraKeys: true,
		})
	}
	p.last = hash
}

func (p *kvPublisher) removed(hash uint64) {
	p.batch.Events = append(p.batch.Events, kvevents.Event{
		Kind: kvevents.BlockRemoved, BlockHashes: []uint64{hash}, Medium: kvevents.MediumGPU, GroupIdx: 0,
	})
}

// appendTokens appends a block's stand-in token ids, drawn from its hash
// below Qwen3's vocabulary size.
func appendTokens(dst []uint32, hash uint64, n int) []uint32 {
	x := hash
	for range n {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		dst = append(dst, uint32(x%151643))
	}
	return dst
}

// flush publishes the pending batch, if any. Called with the engine's
// lock held; Publish does not block.
func (p *kvPublisher) flush() {
	if len(p.batch.Events) == 0 {
		return
	}
	p.batch.TS = float64(time.Now().UnixNano()) / 1e9
	p.batch.DPRank = p.rank
	p.pub.Publish(&p.batch)
	p.batch = kvevents.Batch{DPRank: -1}
}

// KVEndpoints returns each engine's KV-events endpoints (PUB, replay);
// nil when the emulator publishes none.
func (e *Emulator) KVEndpoints() (pub, replay []string) {
	for _, eng := range e.engines {
		if eng.kv == nil {
			return nil, nil
		}
		pub = append(pub, eng.kv.pub.Endpoint())
		replay = append(replay, eng.kv.pub.ReplayEndpoint())
	}
	return pub, replay
}

// KVPublisher returns engine i's publisher (nil: none), for tests that
// make gaps (kvevents.Publisher.DropNext).
func (e *Emulator) KVPublisher(i int) *kvevents.Publisher {
	if e.engines[i].kv == nil {
		return nil
	}
	return e.engines[i].kv.pub
}

// openKVEvents starts a publisher per engine.
func (e *Emulator) openKVEvents(o KVEventsOptions) error {
	if o.Form == 0 {
		return nil
	}
	if o.Endpoint == "" {
		o.Endpoint = "tcp://127.0.0.1:5557"
	}
	for i, eng := range e.engines {
		p, err := newKVPublisher(o, i, e.farm.Spec.VLLM.BlockSize)
		if err != nil {
			return errors.Join(err, e.closeKVEvents())
		}
		eng.kv = p
		eng.eng.WatchCache(p.watch())
	}
	return nil
}

func (e *Emulator) closeKVEvents() error {
	var err error
	for _, eng := range e.engines {
		if eng.kv != nil {
			eng.eng.WatchCache(nil)
			err = errors.Join(err, eng.kv.pub.Close())
			eng.kv = nil
		}
	}
	return err
}
