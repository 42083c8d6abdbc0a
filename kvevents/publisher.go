package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"sync"

	"github.com/go-zeromq/zmq4"
)

// Publisher publishes batches as vLLM's ZmqEventPublisher does: frames
// (topic, seq, payload) on a PUB socket, seq counting from 0, and a
// ROUTER replay socket answering a request for seq s with every buffered
// batch from s, then (-1, "") (vllm/distributed/kv_events.py,
// _publisher_thread and _service_replay). Publish never blocks: batches
// go to a bounded queue that one goroutine sends; a full queue drops the
// batch, which a subscriber then sees as a gap and replays.
type Publisher struct {
	form  Form
	ep    string // the endpoint connected to, with Connect
	topic []byte
	pub   zmq4.Socket
	rep   zmq4.Socket // nil: no replay socket
	queue chan []byte
	done  chan struct{}
	wg    sync.WaitGroup

	mu     sync.Mutex
	seq    uint64
	buf    []bufEntry // ring of the last cap(buf) batches
	bufLen int
	next   int // ring index of the next entry
	drop   bool
}

type bufEntry struct {
	seq     uint64
	payload []byte
}

// PublisherOptions configure NewPublisher.
type PublisherOptions struct {
	// Endpoint is the PUB socket's address to bind, "tcp://host:port"
	// (port 0: chosen by the system; see Addr), or with Connect the
	// subscriber's to connect to.
	Endpoint string
	// Connect makes the PUB socket connect to Endpoint, as vLLM's does
	// when its endpoint has no "*" (a subscriber that listens: warden's
	// kv_events.listen, llm-d's indexer); it reconnects when the
	// connection fails.
	Connect bool
	// ReplayEndpoint is the ROUTER socket's; "" for none.
	ReplayEndpoint string
	Topic          string
	Form           Form
	// BufferSteps is how many past batches replay keeps; 0: vLLM's
	// default 10,000.
	BufferSteps int
}

// NewPublisher binds the sockets and starts the sending goroutine; Close
// stops it.
func NewPublisher(opts PublisherOptions) (*Publisher, error) {
	if opts.Form == 0 {
		opts.Form = FormMap
	}
	if opts.BufferSteps <= 0 {
		opts.BufferSteps = 10_000
	}
	quiet := zmq4.WithLogger(log.New(io.Discard, "", 0))
	p := &Publisher{
		form:  opts.Form,
		topic: []byte(opts.Topic),
		pub:   zmq4.NewPub(context.Background(), quiet, zmq4.WithAutomaticReconnect(opts.Connect)),
		queue: make(chan []byte, 1024),
		done:  make(chan struct{}),
		buf:   make([]bufEntry, opts.BufferSteps),
	}
	bind := p.pub.Listen
	if opts.Connect {
		bind, p.ep = p.pub.Dial, opts.Endpoint
	}
	if err := bind(opts.Endpoint); err != nil {
		p.pub.Close()
		return nil, fmt.Errorf("kv events publisher %s: %w", opts.Endpoint, err)
	}
	if opts.ReplayEndpoint != "" {
		p.rep = zmq4.NewRouter(context.Background(), quiet)
		if err := p.rep.Listen(opts.ReplayEndpoint); err != nil {
			p.pub.Close()
			p.rep.Close()
			return nil, fmt.Errorf("kv events replay %s: %w", opts.ReplayEndpoint, err)
		}
		p.wg.Go(p.serveReplay)
	}
	p.wg.Go(p.send)
	return p, nil
}

// Endpoint is the PUB socket's bound address (with Connect: the one it
// connects to), tcp://host:port.
func (p *Publisher) Endpoint() string {
	if p.ep != "" {
		return p.ep
	}
	return "tcp://" + p.pub.Addr().String()
}

// ReplayEndpoint is the ROUTER socket's, "" when none.
func (p *Publisher) ReplayEndpoint() string {
	if p.rep == nil {
		return ""
	}
	return "tcp://" + p.rep.Addr().(*net.TCPAddr).String()
}

// DropNext makes the next Publish number its batch and keep it for replay
// but not send it: a gap, for tests of subscribers.
func (p *Publisher) DropNext() {
	p.mu.Lock()
	p.drop = true
	p.mu.Unlock()
}

// Publish numbers b, keeps it for replay and queues it to be sent.
func (p *Publisher) Publish(b *Batch) {
	payload := AppendBatch(nil, b, p.form)
	p.mu.Lock()
	seq := p.seq
	p.seq++
	p.buf[p.next] = bufEntry{seq, payload}
	p.next = (p.next + 1) % len(p.buf)
	p.bufLen = min(p.bufLen+1, len(p.buf))
	drop := p.drop
	p.drop = false
	p.mu.Unlock()
	if drop {
		return
	}
	msg := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint64(msg, seq)
	select {
	case p.queue <- append(msg, payload...):
	default: // full: the subscriber will replay it
	}
}

func (p *Publisher) send() {
	for {
		select {
		case <-p.done:
			return
		case m := <-p.queue:
			// A send error (no subscriber yet is not one) loses the batch;
			// subscribers replay it.
			_ = p.pub.Send(zmq4.NewMsgFrom(p.topic, m[:8], m[8:]))
		}
	}
}

// endSeq is the replay's end marker, -1 as 8 bytes.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

func (p *Publisher) serveReplay() {
	for {
		msg, err := p.rep.Recv()
		if err != nil {
			select {
			case <-p.done:
				return
			default:
			}
			if errors.Is(err, context.Canceled) {
				return
			}
			continue
		}
		// [identity, "", start_seq] as vLLM's ROUTER reads a REQ's request.
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			continue
		}
		id, start := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
		p.mu.Lock()
		var out []bufEntry
		for i := range p.bufLen {
			e := p.buf[(p.next-p.bufLen+i+len(p.buf))%len(p.buf)]
			if e.seq >= start {
				out = append(out, e)
			}
		}
		p.mu.Unlock()
		for _, e := range out {
			var s [8]byte
			binary.BigEndian.PutUint64(s[:], e.seq)
			_ = p.rep.Send(zmq4.NewMsgFrom(id, nil, s[:], e.payload))
		}
		_ = p.rep.Send(zmq4.NewMsgFrom(id, nil, endSeq, nil))
	}
}

// Close stops the publisher and closes its sockets. A connection its
// peer closed first is no error.
func (p *Publisher) Close() error {
	close(p.done)
	err := ignoreClosed(p.pub.Close())
	if p.rep != nil {
		err = errors.Join(err, ignoreClosed(p.rep.Close()))
	}
	p.wg.Wait()
	return err
}

func ignoreClosed(err error) error {
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
