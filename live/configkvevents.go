package live

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// KVEventsCfg makes the proxy follow a model's vLLM KV-cache events
// (vLLM's --kv-events-config with publisher zmq; package kvevents): the
// blocks each replica holds and why blocks were computed, on /api/status
// and the dashboard. Either Endpoint, the PUB socket of rank 0 whose
// rank k publishes on port + k (vLLM's offset_endpoint_port), or
// Endpoints, one per replica in order. ReplayEndpoint(s) likewise name
// the ROUTER replay sockets (vLLM's replay_endpoint); without one a gap
// in the sequence numbers is counted lost. Restart or reload to change.
type KVEventsCfg struct {
	Endpoint        string   `yaml:"endpoint"`
	Endpoints       []string `yaml:"endpoints"`
	ReplayEndpoint  string   `yaml:"replay_endpoint"`
	ReplayEndpoints []string `yaml:"replay_endpoints"`
	Topic           string   `yaml:"topic"` // vLLM's kv_events_config topic; "" : all
	// MaxBlocks bounds the blocks remembered per replica; default
	// kvevents.DefaultMaxBlocks (1,048,576).
	MaxBlocks int `yaml:"max_blocks"`
}

// On reports whether events are configured.
func (c *KVEventsCfg) On() bool { return c.Endpoint != "" || len(c.Endpoints) > 0 }

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
				if _, _, err := splitTCP(ep); err != nil {
					return nil, verr(fmt.Sprintf("%s.%ss[%d]", p, field, i), "%v", err)
				}
			}
			return list, nil
		case one == "":
			return make([]string, n), nil
		}
		host, port, err := splitTCP(one)
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
	if c.MaxBlocks < 0 {
		return nil, nil, verr(p+".max_blocks", "want a positive integer, got %d", c.MaxBlocks)
	}
	return pub, replay, nil
}

// splitTCP reads tcp://host:port with a port in 1..65535.
func splitTCP(ep string) (string, int, error) {
	addr, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", 0, fmt.Errorf("%q: want tcp://host:port", ep)
	}
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("%q: %v", ep, err)
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("%q: port must be 1 to 65535", ep)
	}
	return host, port, nil
}
