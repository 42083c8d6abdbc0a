package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"io"
	"log"
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
	// Restarted says the publisher's sequence ran backwards: the engine
	// restarted and its cache is empty.
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
	// MaxPayload bounds one batch's payload; a larger one is dropped and
	// counts as lost. Default 16 MiB.
	MaxPayload int
}

// Subscribe follows one publisher until ctx is done: it subscribes, checks
// every batch's sequence number, asks the replay socket for the batches a
// gap skipped (and, on each (re)connection, for everything it buffered
// since the last one seen) and hands the batches to h in order. It
// reconnects when the connection fails and returns ctx's error.
func Subscribe(ctx context.Context, opts SubscribeOptions, h Handler) error {
	if opts.ReplayTimeout <= 0 {
		opts.ReplayTimeout = 2 * time.Second
	}
	if opts.Retry <= 0 {
		opts.Retry = time.Second
	}
	if opts.MaxPayload <= 0 {
		opts.MaxPayload = 16 << 20
	}
	s := &subscriber{opts: opts, h: h}
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
	opts    SubscribeOptions
	h       Handler
	next    uint64 // the sequence number expected next
	started bool   // a batch was seen
	batch   Batch
	// recent are the payload hashes of the last len(recent) batches
	// delivered, by seq modulo its length: a batch the live stream brings
	// after a replay brought it is told from a restarted publisher's batch
	// with the same number by its bytes.
	recent [1024]seen
}

type seen struct {
	seq, sum uint64
	ok       bool
}

// hashSeed is fixed for the process: payload hashes are compared, never kept.
var hashSeed = maphash.MakeSeed()

// delivered reports whether batch seq, with this payload, was delivered.
func (s *subscriber) delivered(seq uint64, payload []byte) bool {
	r := s.recent[seq%uint64(len(s.recent))]
	return r.ok && r.seq == seq && r.sum == maphash.Bytes(hashSeed, payload)
}

var quietLog = zmq4.WithLogger(log.New(io.Discard, "", 0))

// session is one connection: it returns when the connection fails or ctx
// is done.
func (s *subscriber) session(ctx context.Context) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub := zmq4.NewSub(sctx, quietLog, zmq4.WithDialerMaxRetries(0))
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, s.opts.Topic); err != nil {
		return err
	}
	if err := sub.Dial(dialEndpoint(s.opts.Endpoint)); err != nil {
		return fmt.Errorf("kv events %s: %w", s.opts.Endpoint, err)
	}
	s.h.Status(true, nil)
	// What was published while we were away (or before we came).
	if s.opts.ReplayEndpoint != "" {
		if s.restartedAway(ctx) {
			s.restart(0)
		}
		s.replay(ctx, s.next, 0, false)
	}
	for {
		msg, err := sub.Recv()
		if err != nil {
			return fmt.Errorf("kv events %s: %w", s.opts.Endpoint, err)
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			continue // not vLLM's (topic, seq, payload)
		}
		seq := binary.BigEndian.Uint64(msg.Frames[1])
		switch {
		case s.started && seq < s.next:
			if s.delivered(seq, msg.Frames[2]) {
				continue // replayed, then received as published
			}
			s.restart(seq)
		case seq > s.next:
			s.replay(ctx, s.next, seq, true)
			if seq < s.next {
				continue // the replay brought it already
			}
		}
		s.deliver(seq, msg.Frames[2])
	}
}

// restart tells the handler the publisher restarted and expects seq next.
func (s *subscriber) restart(next uint64) {
	s.h.Restarted()
	s.next, s.started, s.recent = next, false, [len(s.recent)]seen{}
}

// deliver decodes and hands over batch seq.
func (s *subscriber) deliver(seq uint64, payload []byte) {
	var err error
	if len(payload) > s.opts.MaxPayload {
		err = fmt.Errorf("payload of %d bytes, more than %d", len(payload), s.opts.MaxPayload)
	} else {
		err = Decode(payload, &s.batch)
	}
	if err != nil {
		s.h.Undecodable(seq, err)
		s.h.Lost(seq, seq+1)
	} else {
		s.h.Batch(seq, &s.batch)
	}
	s.started = true
	s.next = seq + 1
	s.recent[seq%uint64(len(s.recent))] = seen{seq, maphash.Bytes(hashSeed, payload), true}
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
	if !s.started || s.next == 0 {
		return false
	}
	restarted, answered := false, false
	ended := s.fetch(ctx, s.next-1, func(seq uint64, payload []byte) bool {
		answered = true
		restarted = seq == s.next-1 && !s.delivered(seq, payload)
		return false
	})
	return restarted || (ended && !answered)
}

// replay asks for the batches from `from` on and delivers those before
// `to` (bounded: to > 0) or all. Those it cannot get are lost when
// bounded; unbounded (at connection) a publisher whose buffer starts
// later than `from` leaves them lost too, once a batch was seen.
func (s *subscriber) replay(ctx context.Context, from, to uint64, bounded bool) {
	s.fetch(ctx, from, func(seq uint64, payload []byte) bool {
		if bounded && seq >= to {
			return false
		}
		if seq < s.next && s.started {
			return true
		}
		if seq > s.next {
			s.h.Lost(s.next, seq) // before the buffer's oldest
		}
		s.deliver(seq, payload)
		return true
	})
	if bounded && s.next < to {
		s.h.Lost(s.next, to)
		s.next = to
	}
}

// fetch runs one replay exchange: request `from`, pass each (seq,
// payload) to f until the end marker, a timeout or f returning false. It
// reports whether the exchange ended with the marker.
func (s *subscriber) fetch(ctx context.Context, from uint64, f func(uint64, []byte) bool) bool {
	if s.opts.ReplayEndpoint == "" {
		return false
	}
	rctx, cancel := context.WithTimeout(ctx, s.opts.ReplayTimeout)
	defer cancel()
	d := zmq4.NewDealer(rctx, quietLog, zmq4.WithDialerMaxRetries(0))
	defer d.Close()
	if err := d.Dial(dialEndpoint(s.opts.ReplayEndpoint)); err != nil {
		return false
	}
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], from)
	if err := d.Send(zmq4.NewMsgFrom(nil, req[:])); err != nil {
		return false
	}
	for {
		msg, err := d.Recv()
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
		if seq == 1<<64-1 {
			return true
		}
		if !f(seq, fr[1]) {
			return true
		}
	}
}
