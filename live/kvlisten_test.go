package live

import (
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/internal/fakevllm"
	"github.com/lm-warden/warden/kvevents"
)

// TestStatusKVEventsListen: with kv_events.listen the proxy binds a SUB
// socket and the replicas' publishers connect to it, as vLLM's does with
// an endpoint without "*" (llm-d's deployments, llm-d-inference-sim);
// each is told by llm-d's topic kv@<pod>@<model>, <pod> the host:port of
// the replica's URL here (a pod IP in Kubernetes), and its batches'
// data-parallel rank for a data-parallel server's ranks. /api/status shows
// the blocks each replica holds and the listener: the publishers
// connected and the topic no replica has.
func TestStatusKVEventsListen(t *testing.T) {
	a, b := fakevllm.New(t, 1), fakevllm.New(t, 2)
	cases := []struct {
		name   string
		model  string
		topics []string // by replica
		ranks  []int
	}{
		{"replicas by host:port", urlsModel(a.URL(), b.URL()),
			[]string{"kv@" + hostOf(t, a.URL()) + "@qwen", "kv@" + hostOf(t, b.URL()) + "@qwen"}, []int{0, 0}},
		{"a data-parallel server's ranks", "  - name: " + testModel + "\n    url: " + b.URL() + "\n    data_parallel_size: 2\n",
			[]string{"kv@" + hostOf(t, b.URL()) + "@qwen", "kv@" + hostOf(t, b.URL()) + "@qwen"}, []int{0, 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := startProxy(t, modelsYAML("", tc.model+"    kv_events:\n      listen: tcp://127.0.0.1:0\n      listen_ranks: 1\n"))
			h.scraped()
			st := h.waitFor("the listener bound", func(r StatusReport) bool {
				l := r.Models[0].KVEventsListen
				return l != nil && len(l.Addresses) == 1
			}).Models[0]
			ep := st.KVEventsListen.Addresses[0]
			var pubs []*kvevents.Publisher
			for _, topic := range append(tc.topics, "kv@10.9.9.9@qwen") {
				p, err := kvevents.NewPublisher(kvevents.PublisherOptions{Endpoint: ep, Connect: true, Topic: topic, Form: kvevents.FormMap})
				if err != nil {
					t.Fatal(err)
				}
				defer p.Close()
				pubs = append(pubs, p)
			}
			ranks := append(tc.ranks, 0)
			// A PUB socket drops what it publishes before the subscription
			// reached it: publish until every replica's block arrived.
			held := func(r StatusReport) bool {
				m := r.Models[0]
				for _, rs := range m.Replicas {
					if rs.KVEvents == nil || rs.KVEvents.BlocksHeld == 0 {
						return false
					}
				}
				return m.KVEventsListen.UnknownTopics > 0
			}
			deadline := time.Now().Add(10 * time.Second)
			for r := h.status(); !held(r); r = h.status() {
				if time.Now().After(deadline) {
					t.Fatalf("not every replica heard from: %+v", r.Models[0])
				}
				for i, p := range pubs {
					p.Publish(&kvevents.Batch{TS: 1, DPRank: ranks[i], Events: []kvevents.Event{{
						Kind: kvevents.BlockStored, BlockHashes: []uint64{uint64(100 + i)}, BlockSize: 16, GroupIdx: 0}}})
				}
				time.Sleep(10 * time.Millisecond)
			}
			m := h.status().Models[0]
			for i, rs := range m.Replicas {
				if kv := rs.KVEvents; !kv.Connected || kv.BlocksHeld < 1 || kv.Miss.Cold != 16 { // published until heard: maybe more than once
					t.Errorf("replica %d: %+v, want connected, holding its own block", i, kv)
				}
			}
			if l := m.KVEventsListen; l.LastUnknownTopic != `"kv@10.9.9.9@qwen"` {
				t.Errorf("listener %+v, want the unknown topic named", l)
			}
		})
	}
}

func hostOf(t *testing.T, u string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	return p.Host
}

// TestKVRoutes: llm-d's topic names the pod by IP (Kubernetes) or
// IP:port; replicas that share it are told apart by rank; explicit topics
// win over the URLs.
func TestKVRoutes(t *testing.T) {
	byURL := newKVRoutes(nil, []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.2:8001", "[fd00::1]:8000"})
	byTopic := newKVRoutes([]string{"a", "b", "b"}, []string{"x:1", "x:2", "x:3"})
	cases := []struct {
		r     *kvRoutes
		topic string
		rank  int
		want  int
	}{
		{byURL, "kv@10.0.0.1@Qwen/Qwen3-8B", 0, 0},
		{byURL, "kv@10.0.0.1@Qwen/Qwen3-8B", -1, 0},
		{byURL, "kv@10.0.0.2:8001@m", 0, 2},
		{byURL, "kv@10.0.0.2@m", 0, 1},
		{byURL, "kv@10.0.0.2@m", 1, 2},
		{byURL, "kv@10.0.0.2@m", 3, 2}, // global rank 3 of two per pod: the second
		{byURL, "kv@10.0.0.2@m", -1, -1},
		{byURL, "kv@fd00::1@m", 0, 3},
		{byURL, "kv@[fd00::1]:8000@m", 0, 3},
		{byURL, "kv@10.0.0.9@m", 0, -1},
		{byURL, "kv-events", 0, -1},
		{byTopic, "a", 5, 0},
		{byTopic, "b", 1, 2},
		{byTopic, "kv@x:1@m", 0, -1},
	}
	for _, c := range cases {
		if got := c.r.Replica(c.topic, c.rank); got != c.want {
			t.Errorf("Replica(%q, %d) = %d, want %d", c.topic, c.rank, got, c.want)
		}
	}
}

// TestKVEventsListenConfig: listen mode's keys are checked and named.
func TestKVEventsListenConfig(t *testing.T) {
	cases := []struct{ kv, want string }{
		{"{listen: tcp://0.0.0.0:5557, endpoint: tcp://a:1}", "models[0].kv_events.listen: give listen"},
		{"{listen: 0.0.0.0:5557}", `models[0].kv_events.listen: "0.0.0.0:5557": want tcp://host:port`},
		{"{listen: tcp://0.0.0.0:65535, listen_ranks: 2}", "past 65535"},
		{"{listen: tcp://0.0.0.0:0, listen_ranks: 2}", "port 0 with 2 ranks"},
		{"{listen: tcp://0.0.0.0:5557, topics: [a]}", "models[0].kv_events.topics: 1 topics for 2 replicas"},
		{"{endpoint: tcp://a:1, topics: [a, b]}", "models[0].kv_events.topics: applies to listen mode only"},
		{"{listen: tcp://0.0.0.0:5557, max_batches_per_second: -1}", "max_batches_per_second: want a positive number"},
	}
	for _, c := range cases {
		y := modelsYAML("listen: 127.0.0.1:8080\n", urlsModel("http://127.0.0.1:1", "http://127.0.0.1:2")+"    kv_events: "+c.kv+"\n")
		_, err := ParseConfig("proxy.yaml", []byte(y))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("kv_events %s: %v, want %q", c.kv, err, c.want)
		}
	}
	ok := modelsYAML("listen: 127.0.0.1:8080\n", urlsModel("http://127.0.0.1:1", "http://127.0.0.1:2")+"    kv_events: {listen: tcp://0.0.0.0:5557, topics: [a, b], max_publishers: 4}\n")
	if _, err := ParseConfig("proxy.yaml", []byte(ok)); err != nil {
		t.Error(err)
	}
}

// TestKVEventsListenReload: a reload that replaces the model (its
// replicas changed, as a Kubernetes pod change does) starts a successor
// while its predecessor still holds the listen address; the successor
// binds it once the predecessor let it go, and the publisher's next
// connection is served by it.
func TestKVEventsListenReload(t *testing.T) {
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ep := "tcp://" + free.Addr().String()
	free.Close()
	a, b := fakevllm.New(t, 1), fakevllm.New(t, 1)
	kv := "    kv_events:\n      listen: " + ep + "\n"
	h := startProxy(t, modelsYAML("", urlsModel(a.URL())+kv))
	bound := func(r StatusReport) bool {
		l := r.Models[0].KVEventsListen
		return l != nil && len(l.Addresses) == 1 && l.Error == ""
	}
	h.waitFor("bound", bound)
	cfg, err := ParseConfig("test.yaml", []byte("listen: 127.0.0.1:0\n"+modelsYAML("", urlsModel(a.URL(), b.URL())+kv)))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.srv.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if st := h.waitFor("the successor bound", bound).Models[0]; len(st.Replicas) != 2 || st.KVEventsListen.Addresses[0] != ep {
		t.Fatalf("after the reload: %+v", st)
	}
	p, err := kvevents.NewPublisher(kvevents.PublisherOptions{Endpoint: ep, Connect: true, Topic: "kv@" + hostOf(t, b.URL()) + "@qwen", Form: kvevents.FormMap})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	deadline := time.Now().Add(10 * time.Second)
	for r := h.status(); r.Models[0].Replicas[1].KVEvents.BlocksHeld == 0; r = h.status() {
		if time.Now().After(deadline) {
			t.Fatalf("the added replica never heard from: %+v", r.Models[0])
		}
		p.Publish(&kvevents.Batch{TS: 1, DPRank: 0, Events: []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: []uint64{7}, BlockSize: 16, GroupIdx: 0}}})
		time.Sleep(10 * time.Millisecond)
	}
}

// FuzzKVRoutes: a peer's topic and rank never make Replica panic or
// answer other than a replica's index or -1.
func FuzzKVRoutes(f *testing.F) {
	f.Add("kv@10.0.0.2@m", 3)
	f.Add("kv@[fd00::1]:8000@m", -1)
	f.Add("kv@@@", 1<<62)
	targets := []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.2:8001", "[fd00::1]:8000"}
	routes := []*kvRoutes{newKVRoutes(nil, targets), newKVRoutes([]string{"a", "b", "b", "kv@10.0.0.2@m"}, targets)}
	f.Fuzz(func(t *testing.T, topic string, rank int) {
		for _, r := range routes {
			if i := r.Replica(topic, rank); i < -1 || i >= len(targets) {
				t.Fatalf("Replica(%q, %d) = %d", topic, rank, i)
			}
		}
	})
}
