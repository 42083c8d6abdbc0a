package epp

import (
	"fmt"
	"path/filepath"

	"github.com/lm-warden/warden/live"
)

// ConfigOptions are what warden epp's command line adds to the rules of
// its configuration file.
type ConfigOptions struct {
	// Kubernetes: the endpoints are an InferencePool's ready pods, so the
	// models list no replicas and no url (warden epp --kubernetes).
	Kubernetes bool
	// Keys say where session_key comes from besides the file (warden
	// epp --session-key-file, a Kubernetes Secret's key mounted as a
	// file).
	Keys live.KeyOptions
}

// LoadConfig reads the picker's configuration file (see ParseConfig),
// refusing one over live.MaxConfigBytes as the proxy does.
func LoadConfig(path string, o ConfigOptions) (*live.Config, error) {
	cfg, err := live.LoadConfigKeyed(path, o.Keys, o.prepare())
	return o.finish(filepath.Base(path), cfg, err)
}

// ParseConfig reads the picker's configuration: the proxy's format and
// rules (live.ParseConfigKeyed: no placeholder session_key, the key from
// o.Keys), and the picker's own: every replica an
// endpoint the gateway can be told (CheckConfig), or none under
// o.Kubernetes (the pool's pods are). Errors name the file, the line and
// the key.
func ParseConfig(name string, data []byte, o ConfigOptions) (*live.Config, error) {
	cfg, err := live.ParseConfigKeyed(name, data, o.Keys, o.prepare())
	return o.finish(name, cfg, err)
}

// prepare completes the configuration before it is validated: under
// Kubernetes, the models' placeholder endpoints (poolModels).
func (o ConfigOptions) prepare() func(*live.Config) error {
	if o.Kubernetes {
		return poolModels
	}
	return nil
}

// finish applies the picker's rules to a configuration read as the
// proxy's (err: the reading's).
func (o ConfigOptions) finish(name string, cfg *live.Config, err error) (*live.Config, error) {
	if err != nil {
		return nil, err
	}
	if o.Kubernetes {
		for i := range cfg.Models {
			cfg.Models[i].Replicas = nil
		}
		return cfg, nil
	}
	if err := CheckConfig(cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return cfg, nil
}

// poolModels checks that no model lists its endpoints (the pool gives
// them) and gives each a placeholder replica to be validated with.
func poolModels(c *live.Config) error {
	for i := range c.Models {
		m := &c.Models[i]
		p := fmt.Sprintf("models[%d]", i)
		const why = "with --kubernetes the endpoints are the InferencePool's ready pods, one per pod and target port: leave url, data_parallel_size and replicas out"
		switch {
		case m.URL != "":
			return live.FieldError(p+".url", why)
		case m.DataParallelSize != 0:
			return live.FieldError(p+".data_parallel_size", why)
		case len(m.Replicas) > 0:
			return live.FieldError(p+".replicas", why)
		}
		m.Replicas = []string{poolPlaceholder}
	}
	return nil
}
