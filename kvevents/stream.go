package kvevents

import (
	"fmt"
	"hash/maphash"
	"math"
	"time"

	"golang.org/x/time/rate"
)

// stream follows one publisher's sequence numbers and hands its batches
// to a Handler in order: it tells a gap (asking replay, when it can, for
// what was skipped), a restart (numbers running backwards, or jumping
// further ahead than any engine publishes while followed) and a batch the
// replay brought and the live stream brings again; it drops what comes
// faster than the limits allow.
type stream struct {
	h       Handler
	lim     Limits
	batches *rate.Limiter // nil: no bound
	hashes  *rate.Limiter
	next    uint64 // the sequence number expected next
	started bool   // a batch was seen since the start or the last restart
	batch   Batch
	// recent are the payload hashes of the last len(recent) batches
	// delivered, by seq modulo its length: a batch the live stream brings
	// after a replay brought it is told from a restarted publisher's batch
	// with the same number by its bytes.
	recent [1024]seen
	// replay, when not nil, fetches the batches from `from` on, passing
	// each to f until f returns false; it reports whether the publisher
	// answered to the end.
	replay func(from uint64, f func(seq uint64, payload []byte) bool) bool
}

type seen struct {
	seq, sum uint64
	ok       bool
}

// maxGap is the largest forward jump of sequence numbers taken as a gap:
// vLLM numbers its batches from 0 by one (itertools.count), so a jump
// beyond this (2^24 batches: a day at 200 steps a second) is a publisher
// that restarted with other numbers, not batches lost.
const maxGap = 1 << 24

// endSeqNum is the replay's end marker, -1 as 8 bytes; vLLM never
// publishes it as a batch's number.
const endSeqNum = math.MaxUint64

// replayBurst lets a whole vLLM replay buffer (buffer_steps, default
// 10,000) through the batch bound at once.
const replayBurst = 10_000

// hashSeed is fixed for the process: payload hashes are compared, never kept.
var hashSeed = maphash.MakeSeed()

func newStream(h Handler, lim Limits) *stream {
	s := &stream{h: h, lim: lim}
	if lim.BatchesPerSecond > 0 {
		s.batches = rate.NewLimiter(rate.Limit(lim.BatchesPerSecond), max(replayBurst, int(lim.BatchesPerSecond)))
	}
	if lim.HashesPerSecond > 0 {
		s.hashes = rate.NewLimiter(rate.Limit(lim.HashesPerSecond), max(1, int(lim.HashesPerSecond)))
	}
	s.batch.Reset()
	return s
}

// delivered reports whether batch seq, with this payload, was delivered.
func (s *stream) delivered(seq uint64, payload []byte) bool {
	r := s.recent[seq%uint64(len(s.recent))]
	return r.ok && r.seq == seq && r.sum == maphash.Bytes(hashSeed, payload)
}

// live takes batch seq as the publisher sent it.
func (s *stream) live(seq uint64, payload []byte) {
	if seq == endSeqNum {
		s.h.Undecodable(seq, fmt.Errorf("sequence number %d is the replay's end marker, not a batch's", seq))
		return
	}
	switch {
	case !s.started:
		// The first batch since the start or a restart: those before it
		// were published before we followed (a replay at connection time
		// brought what the publisher kept), not lost.
		s.next = seq
	case seq < s.next:
		if s.delivered(seq, payload) {
			return // replayed, then received as published
		}
		s.restart(seq)
	case seq-s.next > maxGap:
		s.restart(seq)
	case seq > s.next:
		s.fill(s.next, seq)
		if seq < s.next {
			return // the replay brought it already
		}
	}
	s.deliver(seq, payload)
}

// restart tells the handler the publisher restarted and expects seq next.
func (s *stream) restart(next uint64) {
	s.h.Restarted()
	s.next, s.started, s.recent = next, false, [len(s.recent)]seen{}
}

// lost reports batches [from, to) lost; next moves past them.
func (s *stream) lost(from, to uint64) {
	if to > from {
		s.h.Lost(from, to)
	}
	s.next = to
}

// fill asks the replay for the batches [from, to) and reports those it
// cannot bring as lost.
func (s *stream) fill(from, to uint64) {
	if s.replay != nil {
		s.replay(from, func(seq uint64, payload []byte) bool {
			if seq >= to {
				return false
			}
			s.replayed(seq, payload)
			return true
		})
	}
	if s.next < to {
		s.lost(s.next, to)
	}
}

// replayed takes batch seq as a replay answered it.
func (s *stream) replayed(seq uint64, payload []byte) {
	if seq == endSeqNum || (s.started && seq < s.next) {
		return
	}
	if s.started && seq > s.next {
		if seq-s.next > maxGap {
			return // not this publisher's numbering
		}
		s.lost(s.next, seq) // before the buffer's oldest
	}
	s.deliver(seq, payload)
}

// deliver decodes and hands over batch seq, or drops it past the limits.
func (s *stream) deliver(seq uint64, payload []byte) {
	now := time.Now()
	var err error
	switch {
	case s.batches != nil && !s.batches.AllowN(now, 1):
		s.drop(seq, "batches")
	case len(payload) > s.lim.MaxPayload:
		err = fmt.Errorf("payload of %d bytes, more than %d", len(payload), s.lim.MaxPayload)
	default:
		if err = Decode(payload, &s.batch); err != nil {
			break
		}
		if s.hashes != nil && !s.hashes.AllowN(now, s.batch.hashCount()) {
			s.drop(seq, "block hashes")
			break
		}
		s.h.Batch(seq, &s.batch)
	}
	if err != nil {
		s.h.Undecodable(seq, err)
		s.h.Lost(seq, seq+1)
	}
	s.started = true
	s.next = seq + 1
	s.recent[seq%uint64(len(s.recent))] = seen{seq, maphash.Bytes(hashSeed, payload), true}
}

// drop counts batch seq dropped for coming faster than the bound on what
// (batches or block hashes per second); what it said is unknown, so it is
// lost as a gap is.
func (s *stream) drop(seq uint64, what string) {
	s.h.Dropped(seq, what)
	s.h.Lost(seq, seq+1)
}

// hashCount is the block hashes of b's events: the ledger's work.
func (b *Batch) hashCount() int {
	n := 0
	for i := range b.Events {
		n += len(b.Events[i].BlockHashes)
	}
	return max(n, 1)
}
