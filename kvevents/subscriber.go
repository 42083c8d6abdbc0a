package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Handler receives one replica's batches in sequence order.
type Handler interface {
	// Batch is batch seq, decoded (b is reused after Batch returns).
	Batch(seq uint64, b *Batch)
	// Lost says batches [from, to) could not be had, not even by replay:
	// what the handler knows is incomplete until the next AllBlocksCleared.
	Lost(from, to uint64)
	// Dropped says batch seq came faster than the limits allow (what: the
	// bound it broke, "batches" or "block hashes" per second) and was
	// dropped; Lost follows.
	Dropped(seq uint64, what string)
	// Restarted says the publisher's sequence ran backwards (or jumped
	// further ahead than a publisher counts): the engine restarted and
	// its cache is empty.
	Restarted()
	// Status reports the connection: connected or not, and why not.
	Status(connected bool, err error)
	// Undecodable says batch seq was not a KVEventBatch this package reads
	// (a changed wire format, or a payload over MaxPayload); Lost follows.
	Undecodable(seq uint64, err error)
}

// SubscribeOptions configure Subscribe.
type SubscribeOptions struct {
	Endpoint       string // the PUB socket, tcp://host:port
	ReplayEndpoint string // the ROUTER replay socket; "": gaps are lost
	Topic          string // "" : every topic
	// ReplayTimeout bounds one replay exchange; default 2s.
	ReplayTimeout time.Duration
	// Retry is the wait before reconnecting; default 1s.
	Retry time.Duration
	// Limits bound what the publisher can make warden hold, wait for and
	// do.
	Limits Limits
}

// Subscribe follows one publisher until ctx is done: it connects (a SUB
// socket's side of ZMTP), subscribes, checks every batch's sequence
// number, asks the replay socket for the batches a gap skipped (and, on
// each (re)connection, for everything it buffered since the last one
// seen) and hands the batches to h in order. It reconnects when the
// connection fails or a phase of it stalls, and returns ctx's error.
func Subscribe(ctx context.Context, opts SubscribeOptions, h Handler) error {
	if opts.ReplayTimeout <= 0 {
		opts.ReplayTimeout = 2 * time.Second
	}
	if opts.Retry <= 0 {
		opts.Retry = time.Second
	}
	opts.Limits = opts.Limits.withDefaults()
	s := &subscriber{opts: opts, stream: newStream(h, opts.Limits)}
	if opts.ReplayEndpoint != "" {
		s.stream.replay = func(from uint64, f func(uint64, []byte) bool) bool { return s.fetch(ctx, from, f) }
	}
	for {
		err := s.session(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		h.Status(false, err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(opts.Retry):
		}
	}
}

type subscriber struct {
	opts   SubscribeOptions
	stream *stream
}

// subscribeMsg is a SUB socket's subscription to topic (ZMTP 3.0: a
// message of 1 then the prefix; libzmq accepts it from 3.0 peers).
func subscribeMsg(topic string) zmq4.Msg {
	return zmq4.NewMsg(append([]byte{1}, topic...))
}

// session is one connection: it returns when the connection fails or ctx
// is done.
func (s *subscriber) session(ctx context.Context) error {
	c, closeConn, err := dialZMTP(ctx, s.opts.Endpoint, zmq4.Sub, s.opts.Limits)
	if err != nil {
		return fmt.Errorf("kv events %s: %w", s.opts.Endpoint, err)
	}
	defer closeConn()
	if err := c.SendMsg(subscribeMsg(s.opts.Topic)); err != nil {
		return fmt.Errorf("kv events %s: subscribing: %w", s.opts.Endpoint, err)
	}
	st := s.stream
	st.h.Status(true, nil)
	// What was published while we were away (or before we came).
	if s.opts.ReplayEndpoint != "" {
		if s.restartedAway(ctx) {
			st.restart(0)
		}
		st.replay(st.next, func(seq uint64, payload []byte) bool {
			st.replayed(seq, payload)
			return true
		})
	}
	for {
		msg, err := c.recv()
		if err != nil {
			return fmt.Errorf("kv events %s: %w", s.opts.Endpoint, err)
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			continue // not vLLM's (topic, seq, payload)
		}
		st.live(binary.BigEndian.Uint64(msg.Frames[1]), msg.Frames[2])
	}
}

// restartedAway reports whether the publisher we reconnected to is a new
// one (the engine restarted while we were away). The live check (a
// sequence number below the next expected) misses a restarted engine
// that published as many batches as we had seen before we came back: its
// numbers then continue ours. So ask the replay socket for the last batch
// we saw: the same publisher still has it, byte for byte (vLLM's
// ZmqEventPublisher keeps the last buffer_steps batches, default 10000,
// and each batch carries its timestamp); a new one answers with another
// payload at that number, or, being behind us, with nothing. A first
// batch past it (our last one aged out of a short buffer) leaves the
// question open: the live check still stands.
func (s *subscriber) restartedAway(ctx context.Context) bool {
	st := s.stream
	if !st.started || st.next == 0 {
		return false
	}
	restarted, answered := false, false
	ended := s.fetch(ctx, st.next-1, func(seq uint64, payload []byte) bool {
		answered = true
		restarted = seq == st.next-1 && !st.delivered(seq, payload)
		return false
	})
	return restarted || (ended && !answered)
}

// fetch runs one replay exchange: request `from`, pass each (seq,
// payload) to f until the end marker, a timeout or f returning false. It
// reports whether the exchange ended with the marker (or f).
func (s *subscriber) fetch(ctx context.Context, from uint64, f func(uint64, []byte) bool) bool {
	rctx, cancel := context.WithTimeout(ctx, s.opts.ReplayTimeout)
	defer cancel()
	d, closeConn, err := dialZMTP(rctx, s.opts.ReplayEndpoint, zmq4.Dealer, s.opts.Limits)
	if err != nil {
		return false
	}
	defer closeConn()
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], from)
	// [delimiter, start_seq]: the ROUTER adds our identity, and vLLM's
	// _service_replay reads [identity, "", start_seq].
	if err := d.SendMsg(zmq4.NewMsgFrom(nil, req[:])); err != nil {
		return false
	}
	for {
		msg, err := d.recv()
		if err != nil {
			return false
		}
		fr := msg.Frames
		if len(fr) > 0 && len(fr[0]) == 0 {
			fr = fr[1:] // the empty delimiter
		}
		if len(fr) != 2 || len(fr[0]) != 8 {
			continue
		}
		seq := binary.BigEndian.Uint64(fr[0])
		if seq == endSeqNum {
			return true
		}
		if !f(seq, fr[1]) {
			return true
		}
	}
}
