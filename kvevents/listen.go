package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Listen mode: the publishers connect. In llm-d's deployments each vLLM
// pod connects its PUB socket to the indexer's bound SUB socket
// (--kv-events-config endpoint tcp://<indexer>:5557, topic
// kv@<pod-ip>@<model>; vLLM connects rather than binds when the endpoint
// has no "*", "::", ipc:// or inproc://, ZmqEventPublisher._socket_setup),
// and llm-d-inference-sim only dials. Publishers are then told apart by
// the topic of their messages and the data_parallel_rank of their batches
// (Router), one stream per replica: a publisher that reconnects continues
// its numbering, one that restarted starts again from 0.

// Router maps a publisher to a replica.
type Router interface {
	// Replica is the index of the replica that publishes on topic with
	// data-parallel rank (-1: the batch has none), or -1 for a topic no
	// configured replica has.
	Replica(topic string, rank int) int
}

// ListenOptions configure a Listener.
type ListenOptions struct {
	// Endpoints are the addresses to bind, tcp://host:port. vLLM's rank k
	// connects to its endpoint's port + k (offset_endpoint_port applies to
	// a connect endpoint too): a data-parallel server needs one per rank.
	Endpoints []string
	Topic     string // subscription prefix; "": every topic
	Router    Router
	Handlers  []Handler // by replica index
	// MaxConns bounds the publishers connected at once (each may hold a
	// message of Limits.MaxPayload); beyond, a connection is closed at
	// once and counted. Default 2 x len(Handlers) + 8.
	MaxConns int
	// Retry is the wait before binding again when an address is taken (a
	// reload's successor binds while its predecessor lets go); default 200ms.
	Retry  time.Duration
	Limits Limits
}

// ListenStatus is what a Listener says of itself.
type ListenStatus struct {
	Addresses   []string `json:"addresses"`       // bound
	Error       string   `json:"error,omitempty"` // why an address is not bound
	Connections int      `json:"connections"`     // publishers connected now
	// Refused counts connections closed at once, MaxConns being reached.
	Refused int64 `json:"connections_refused"`
	// UnknownTopics counts connections closed because their first batch's
	// topic (and rank) named no configured replica; LastUnknownTopic is
	// the last such topic, cut to 128 bytes.
	UnknownTopics    int64  `json:"unknown_topics"`
	LastUnknownTopic string `json:"last_unknown_topic,omitempty"`
	// Undecodable counts connections closed because their first batch did
	// not decode (no rank to route it by).
	Undecodable int64 `json:"first_batch_undecodable"`
}

// Listener binds SUB sockets for publishers that connect and hands each
// replica's batches to its Handler.
type Listener struct {
	opts    ListenOptions
	streams []*lstream
	conns   chan struct{} // a slot per connection

	mu sync.Mutex
	st ListenStatus
}

// lstream is one replica's stream, shared by the connections that publish
// for it (a publisher's old and new connection may overlap).
type lstream struct {
	mu        sync.Mutex
	s         *stream
	connected int
}

// NewListener returns a Listener; Run binds and serves.
func NewListener(opts ListenOptions) *Listener {
	opts.Limits = opts.Limits.withDefaults()
	if opts.MaxConns <= 0 {
		opts.MaxConns = 2*len(opts.Handlers) + 8
	}
	if opts.Retry <= 0 {
		opts.Retry = 200 * time.Millisecond
	}
	l := &Listener{opts: opts, conns: make(chan struct{}, opts.MaxConns)}
	for _, h := range opts.Handlers {
		l.streams = append(l.streams, &lstream{s: newStream(h, opts.Limits)})
	}
	return l
}

// Status returns what the listener says of itself now.
func (l *Listener) Status() ListenStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.st
	st.Addresses = append([]string(nil), l.st.Addresses...)
	st.Connections = len(l.conns)
	return st
}

func (l *Listener) update(f func(*ListenStatus)) {
	l.mu.Lock()
	f(&l.st)
	l.mu.Unlock()
}

// Run binds every endpoint (retrying while one is taken) and serves the
// publishers that connect until ctx is done; it returns when every
// connection has ended.
func (l *Listener) Run(ctx context.Context) error {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	var lc net.ListenConfig
	for _, ep := range l.opts.Endpoints {
		addr, ok := strings.CutPrefix(ep, "tcp://")
		if !ok {
			return fmt.Errorf("kv events listen %q: want tcp://host:port", ep)
		}
		for {
			ln, err := lc.Listen(ctx, "tcp", addr)
			if err == nil {
				lns = append(lns, ln)
				l.update(func(s *ListenStatus) {
					s.Addresses, s.Error = append(s.Addresses, "tcp://"+ln.Addr().String()), ""
				})
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			l.update(func(s *ListenStatus) { s.Error = fmt.Sprintf("kv events listen %s: %v", ep, err) })
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(l.opts.Retry):
			}
		}
	}
	var wg sync.WaitGroup
	for _, ln := range lns {
		wg.Go(func() { l.accept(ctx, ln, &wg) })
	}
	<-ctx.Done()
	for _, ln := range lns {
		ln.Close()
	}
	wg.Wait()
	return ctx.Err()
}

func (l *Listener) accept(ctx context.Context, ln net.Listener, wg *sync.WaitGroup) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and the like: let go a moment
			continue
		}
		select {
		case l.conns <- struct{}{}:
		default:
			c.Close()
			l.update(func(s *ListenStatus) { s.Refused++ })
			continue
		}
		wg.Go(func() {
			defer func() { <-l.conns }()
			stop := context.AfterFunc(ctx, func() { c.Close() })
			defer stop()
			l.serve(c)
		})
	}
}

// serve follows one publisher's connection until it fails.
func (l *Listener) serve(c net.Conn) {
	zc, err := openZMTP(c, zmq4.Sub, true, l.opts.Limits)
	if err != nil {
		return
	}
	defer zc.Close()
	if err := zc.SendMsg(subscribeMsg(l.opts.Topic)); err != nil {
		return
	}
	var (
		bound *lstream
		topic string
		probe Batch
	)
	defer func() {
		if bound != nil {
			bound.mu.Lock()
			if bound.connected--; bound.connected == 0 {
				bound.s.h.Status(false, fmt.Errorf("kv events: the publisher %s on %q went away: %w", c.RemoteAddr(), cut(topic), err))
			}
			bound.mu.Unlock()
		}
	}()
	for {
		var msg zmq4.Msg
		if msg, err = zc.recv(); err != nil {
			return
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			continue // not vLLM's (topic, seq, payload)
		}
		seq, payload := binary.BigEndian.Uint64(msg.Frames[1]), msg.Frames[2]
		if bound == nil {
			// The first batch names the replica: its topic and rank.
			if len(payload) > l.opts.Limits.MaxPayload || Decode(payload, &probe) != nil {
				l.update(func(s *ListenStatus) { s.Undecodable++ })
				err = errors.New("first batch undecodable")
				return
			}
			topic = string(msg.Frames[0])
			i := l.opts.Router.Replica(topic, probe.DPRank)
			if i < 0 || i >= len(l.streams) {
				l.update(func(s *ListenStatus) { s.UnknownTopics++; s.LastUnknownTopic = cut(topic) })
				err = errors.New("unknown topic")
				return
			}
			bound = l.streams[i]
			bound.mu.Lock()
			if bound.connected++; bound.connected == 1 {
				bound.s.h.Status(true, nil)
			}
			bound.mu.Unlock()
		} else if string(msg.Frames[0]) != topic {
			continue // one publisher, one topic
		}
		bound.mu.Lock()
		bound.s.live(seq, payload)
		bound.mu.Unlock()
	}
}

// cut quotes a peer's topic for the status page, cut to 128 bytes.
func cut(topic string) string {
	if len(topic) > 128 {
		return strconv.Quote(topic[:128]) + "..."
	}
	return strconv.Quote(topic)
}
