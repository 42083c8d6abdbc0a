package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
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
			if seq+1 == s.next {
				continue // a duplicate of the last one (replayed, then published)
			}
			s.h.Restarted()
			s.next = seq
		case seq > s.next:
			s.replay(ctx, s.next, seq, true)
			if seq < s.next {
				continue // the replay brought it already
			}
		}
		s.deliver(seq, msg.Frames[2])
	}
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
