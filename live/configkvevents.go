package live

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/lm-warden/warden/kvevents"
)

// KVEventsCfg makes the proxy follow a model's vLLM KV-cache events
// (vLLM's --kv-events-config with publisher zmq; package kvevents): the
// blocks each replica holds and why blocks were computed, on /api/status
// and the dashboard. Two modes, as vLLM binds or connects its PUB socket:
//
//   - the proxy dials (vLLM's endpoint tcp://*:5557, bound): Endpoint,
//     the PUB socket of rank 0 whose rank k publishes on port + k (vLLM's
//     offset_endpoint_port), or Endpoints, one per replica in order.
//     ReplayEndpoint(s) likewise name the ROUTER replay sockets (vLLM's
//     replay_endpoint); without one a gap in the sequence numbers is
//     counted lost.
//   - the proxy listens (vLLM's endpoint tcp://<proxy>:5557, connected, as
//     llm-d deploys it): Listen binds a SUB socket, and its port + k for
//     k < ListenRanks (rank k connects to port + k). A publisher is told
//     by the topic of its messages and its batches' data_parallel_rank:
//     Topics, one per replica, or by default llm-d's kv@<pod>@<model>
//     with <pod> the host (or host:port) of the replica's URL. Replicas
//     that share a topic or host are told apart by rank: rank r is the
//     (r mod n)-th of those n, in order (a data-parallel server's ranks
//     are its replicas in order). No replay: gaps are lost.
//
// Restart or reload to change.
type KVEventsCfg struct {
	Endpoint        string   `yaml:"endpoint"`
	Endpoints       []string `yaml:"endpoints"`
	ReplayEndpoint  string   `yaml:"replay_endpoint"`
	ReplayEndpoints []string `yaml:"replay_endpoints"`
	Listen          string   `yaml:"listen"`
	// ListenRanks is how many ports from Listen's are bound; default the
	// model's data_parallel_size with url, 1 with replicas (each server
	// rank 0; give the ranks for servers started with --data-parallel-rank).
	ListenRanks int      `yaml:"listen_ranks"`
	Topics      []string `yaml:"topics"`
	// MaxPublishers bounds the publishers connected at once in listen
	// mode; default 2 x replicas + 8.
	MaxPublishers int    `yaml:"max_publishers"`
	Topic         string `yaml:"topic"` // subscription prefix (vLLM's kv_events_config topic); "" : all
	// MaxBlocks bounds the blocks remembered per replica; default
	// kvevents.DefaultMaxBlocks (1,048,576).
	MaxBlocks int `yaml:"max_blocks"`
	// MaxBatchesPerSecond and MaxHashesPerSecond bound the work each
	// publisher can cause; beyond, batches are dropped, counted
	// (batches_dropped) and lost. Defaults 2,000 and 1,000,000.
	MaxBatchesPerSecond float64 `yaml:"max_batches_per_second"`
	MaxHashesPerSecond  float64 `yaml:"max_hashes_per_second"`
}

// On reports whether events are configured.
func (c *KVEventsCfg) On() bool { return c.Endpoint != "" || len(c.Endpoints) > 0 || c.Listen != "" }

// limits are the bounds on each publisher.
func (c *KVEventsCfg) limits() kvevents.Limits {
	return kvevents.Limits{BatchesPerSecond: c.MaxBatchesPerSecond, HashesPerSecond: c.MaxHashesPerSecond}
}

// check validates the block of model p with n replicas (ranks: its
// data_parallel_size with url, else 1).
func (c *KVEventsCfg) check(model string, n, ranks int) error {
	p := model + ".kv_events"
	switch {
	case c.MaxBlocks < 0:
		return verr(p+".max_blocks", "want a positive integer, got %d", c.MaxBlocks)
	case c.MaxBatchesPerSecond < 0:
		return verr(p+".max_batches_per_second", "want a positive number, got %g", c.MaxBatchesPerSecond)
	case c.MaxHashesPerSecond < 0:
		return verr(p+".max_hashes_per_second", "want a positive number, got %g", c.MaxHashesPerSecond)
	case c.MaxPublishers < 0:
		return verr(p+".max_publishers", "want a positive integer, got %d", c.MaxPublishers)
	}
	if c.Listen == "" {
		for _, k := range []struct {
			set  bool
			name string
		}{{c.ListenRanks != 0, "listen_ranks"}, {len(c.Topics) > 0, "topics"}, {c.MaxPublishers != 0, "max_publishers"}} {
			if k.set {
				return verr(p+"."+k.name, "applies to listen mode only (set listen)")
			}
		}
		_, _, err := c.endpoints(model, n)
		return err
	}
	if c.Endpoint != "" || len(c.Endpoints) > 0 || c.ReplayEndpoint != "" || len(c.ReplayEndpoints) > 0 {
		return verr(p+".listen", "give listen (publishers connect) or endpoint(s) (the proxy dials), not both; in listen mode there is no replay")
	}
	_, err := c.listenEndpoints(p, ranks)
	if err != nil {
		return err
	}
	if len(c.Topics) > 0 && len(c.Topics) != n {
		return verr(p+".topics", "%d topics for %d replicas", len(c.Topics), n)
	}
	for i, t := range c.Topics {
		if t == "" {
			return verr(fmt.Sprintf("%s.topics[%d]", p, i), "empty topic")
		}
	}
	return nil
}

// listenEndpoints are the addresses listen mode binds: Listen's port and
// the next ones, one per rank.
func (c *KVEventsCfg) listenEndpoints(p string, ranks int) ([]string, error) {
	host, port, err := splitTCP(c.Listen, true)
	if err != nil {
		return nil, verr(p+".listen", "%v", err)
	}
	if c.ListenRanks < 0 {
		return nil, verr(p+".listen_ranks", "want a positive integer, got %d", c.ListenRanks)
	}
	if c.ListenRanks > 0 {
		ranks = c.ListenRanks
	}
	ranks = max(ranks, 1)
	if port == 0 && ranks > 1 {
		return nil, verr(p+".listen", "port 0 with %d ranks: rank k connects to the port + k, give a port", ranks)
	}
	if port+ranks-1 > 65535 {
		return nil, verr(p+".listen", "port %d + %d ranks is past 65535", port, ranks-1)
	}
	out := make([]string, ranks)
	for k := range ranks {
		out[k] = "tcp://" + net.JoinHostPort(host, strconv.Itoa(port+k))
	}
	return out, nil
}

// endpoints returns each of n replicas' PUB and replay endpoints ("" :
// no replay), or an error naming the field p.kv_events.X.
func (c *KVEventsCfg) endpoints(p string, n int) (pub, replay []string, err error) {
	p += ".kv_events"
	pick := func(one string, list []string, field string) ([]string, error) {
		switch {
		case one != "" && len(list) > 0:
			return nil, verr(p+"."+field, "give %s or %ss, not both", field, field)
		case len(list) > 0:
			if len(list) != n {
				return nil, verr(p+"."+field+"s", "%d endpoints for %d replicas", len(list), n)
			}
			for i, ep := range list {
				if _, _, err := splitTCP(ep, false); err != nil {
					return nil, verr(fmt.Sprintf("%s.%ss[%d]", p, field, i), "%v", err)
				}
			}
			return list, nil
		case one == "":
			return make([]string, n), nil
		}
		host, port, err := splitTCP(one, false)
		if err != nil {
			return nil, verr(p+"."+field, "%v", err)
		}
		if port+n-1 > 65535 {
			return nil, verr(p+"."+field, "port %d + %d ranks is past 65535", port, n-1)
		}
		out := make([]string, n)
		for k := range n {
			out[k] = "tcp://" + net.JoinHostPort(host, strconv.Itoa(port+k))
		}
		return out, nil
	}
	if pub, err = pick(c.Endpoint, c.Endpoints, "endpoint"); err != nil {
		return nil, nil, err
	}
	if replay, err = pick(c.ReplayEndpoint, c.ReplayEndpoints, "replay_endpoint"); err != nil {
		return nil, nil, err
	}
	return pub, replay, nil
}

// splitTCP reads tcp://host:port with a port in 1..65535 (0 too, to bind
// a port of the system's choosing, when zero is true).
func splitTCP(ep string, zero bool) (string, int, error) {
	addr, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", 0, fmt.Errorf("%q: want tcp://host:port", ep)
	}
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("%q: %v", ep, err)
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 0 || port > 65535 || (port == 0 && !zero) {
		return "", 0, fmt.Errorf("%q: port must be 1 to 65535", ep)
	}
	return host, port, nil
}

// kvRoutes tell listen mode's publishers apart: a topic (or, by default,
// the pod its llm-d topic names) picks the replicas that may publish on
// it, the batch's data-parallel rank one of them.
type kvRoutes struct {
	byTopic    map[string][]int // topics given
	byHostPort map[string][]int // else by the replicas' URLs
	byHost     map[string][]int
}

// newKVRoutes maps topics, or the hosts of the replicas' URLs, to their
// replicas.
func newKVRoutes(topics []string, targets []string) *kvRoutes {
	r := &kvRoutes{}
	if len(topics) > 0 {
		r.byTopic = map[string][]int{}
		for i, t := range topics {
			r.byTopic[t] = append(r.byTopic[t], i)
		}
		return r
	}
	r.byHostPort, r.byHost = map[string][]int{}, map[string][]int{}
	for i, hp := range targets {
		host, _, err := net.SplitHostPort(hp)
		if err != nil {
			host = hp
		}
		host = strings.ToLower(host)
		r.byHost[host] = append(r.byHost[host], i)
		if err == nil {
			k := strings.ToLower(hp)
			r.byHostPort[k] = append(r.byHostPort[k], i)
		}
	}
	return r
}

// Replica is the replica of topic and rank, or -1.
func (r *kvRoutes) Replica(topic string, rank int) int {
	var group []int
	if r.byTopic != nil {
		group = r.byTopic[topic]
	} else {
		// llm-d's kv@<pod>@<model>: <pod> an IP, or IP:port.
		parts := strings.SplitN(topic, "@", 3)
		if len(parts) != 3 {
			return -1
		}
		pod := strings.ToLower(parts[1])
		if group = r.byHostPort[pod]; group == nil {
			host := pod
			if h, _, err := net.SplitHostPort(pod); err == nil {
				host = h
			}
			group = r.byHost[strings.Trim(host, "[]")]
		}
	}
	switch {
	case len(group) == 1:
		return group[0]
	case len(group) > 1 && rank >= 0:
		return group[rank%len(group)]
	}
	return -1
}

// kvRanks is how many data-parallel ranks connect to listen mode's ports
// by default: a url + data_parallel_size server's, else one (rank 0).
func (m *ModelCfg) kvRanks() int {
	if m.Layout() == LayoutDP {
		return m.DataParallelSize
	}
	return 1
}
