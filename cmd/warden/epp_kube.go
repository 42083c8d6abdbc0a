package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/lm-warden/warden/epp"
	"github.com/lm-warden/warden/live"
)

// kubeClients are the Kubernetes API clients of warden epp --kubernetes;
// tests give client-go's fakes (k8s.io/client-go/kubernetes/fake and
// dynamic/fake).
type kubeClients struct {
	Core    kubernetes.Interface
	Dynamic dynamic.Interface
}

// kubeOpenTimeout bounds reading the pool at start, so that an API server
// that does not answer is an error rather than a picker that never serves.
const kubeOpenTimeout = 30 * time.Second

// connectKube builds the clients as kubectl would: --kubeconfig, else
// $KUBECONFIG, else ~/.kube/config, else the pod's service account
// (in-cluster); the namespace is the kubeconfig context's, or in a
// cluster the pod's own (the service account's namespace file), else
// "default".
func connectKube(kubeconfig string) (kubeClients, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	rc, err := cc.ClientConfig()
	if err != nil {
		if clientcmd.IsEmptyConfig(err) {
			return kubeClients{}, "", errors.New("--kubernetes: no Kubernetes configuration: not running in a cluster (no service account) and no kubeconfig (--kubeconfig, $KUBECONFIG or ~/.kube/config)")
		}
		return kubeClients{}, "", fmt.Errorf("--kubernetes: %w", err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		return kubeClients{}, "", fmt.Errorf("--kubernetes: the namespace: %w", err)
	}
	rc.UserAgent = "warden-epp/" + version
	core, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return kubeClients{}, "", fmt.Errorf("--kubernetes: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return kubeClients{}, "", fmt.Errorf("--kubernetes: %w", err)
	}
	return kubeClients{Core: core, Dynamic: dyn}, ns, nil
}

// replicaSet is the one way the picker's replicas change: a new
// configuration (SIGHUP) and, with --kubernetes, a new set of the pool's
// endpoints. Each change is a live reload, so that the sessions homed on
// the endpoints that stay keep their homes.
type replicaSet struct {
	ls    *live.Server
	kube  bool
	hosts []string // added to admin_hosts: the picker's Service names (--service)

	mu   sync.Mutex
	base *live.Config // the configuration file's
	eps  []string     // kube: the pool's endpoints, ip:port
}

func newReplicaSet(cfg *live.Config, kube bool, hosts []string, opts ...live.Option) (*replicaSet, error) {
	r := &replicaSet{kube: kube, base: cfg, hosts: hosts}
	ls, err := live.NewServer(r.config(), opts...)
	if err != nil {
		return nil, err
	}
	r.ls = ls
	return r, nil
}

// config is what the picker runs: the file's, with the pool's endpoints
// as every model's replicas under --kubernetes (none before the first
// sync: every request is answered 503).
func (r *replicaSet) config() *live.Config {
	cfg := r.base
	if r.kube {
		cfg = epp.WithEndpoints(r.base, r.eps)
	}
	if len(r.hosts) > 0 {
		c := *cfg
		c.AdminHosts = append(slices.Clone(cfg.AdminHosts), r.hosts...)
		cfg = &c
	}
	return cfg
}

// serviceNames are the names by which a pod reaches the Service name in
// namespace ns (none: the name alone): name, name.ns, name.ns.svc, and
// name under each DNS search domain of the pod (Kubernetes writes
// ns.svc.cluster.local, svc.cluster.local and cluster.local there), so
// that the admin address answers a scrape by Service DNS whatever the
// namespace and the cluster's domain.
func serviceNames(name, ns string, search []string) []string {
	out := []string{name}
	if ns != "" {
		out = append(out, name+"."+ns, name+"."+ns+".svc")
	}
	for _, d := range search {
		if n := name + "." + strings.TrimSuffix(d, "."); !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// searchDomains reads the search domains of a resolv.conf (none when it
// cannot be read).
func searchDomains(path string) []string {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for line := range strings.Lines(string(data)) {
		if f := strings.Fields(line); len(f) > 1 && (f[0] == "search" || f[0] == "domain") {
			out = append(out, f[1:]...)
		}
	}
	return out
}

// setConfig reloads a new configuration, keeping the pool's endpoints.
func (r *replicaSet) setConfig(cfg *live.Config) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.base
	r.base = cfg
	if err := r.ls.Reload(r.config()); err != nil {
		r.base = old
		return err
	}
	return nil
}

// setEndpoints reloads the pool's new endpoints (epp.Pool's Apply).
func (r *replicaSet) setEndpoints(eps []string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.eps
	r.eps = slices.Clone(eps)
	if err := r.ls.Reload(r.config()); err != nil {
		r.eps = old
		return err
	}
	return nil
}

// followPool reads the InferencePool named by opts with the clients,
// feeds its ready pods into rs and returns once they were applied: at
// start, an API server that cannot be reached, a pool not found or an
// RBAC refusal is an error naming the pool and the namespace. The pool
// is then followed (its pods, and its selector and target ports) until
// ctx is done; done gives Run's result.
func followPool(ctx context.Context, kc kubeClients, namespace, pool string, rs *replicaSet, log *slog.Logger) (done <-chan error, err error) {
	p := &epp.Pool{Core: kc.Core, Dynamic: kc.Dynamic, Namespace: namespace, Name: pool, Log: log, Apply: rs.setEndpoints}
	octx, cancel := context.WithTimeout(ctx, kubeOpenTimeout)
	spec, err := p.Open(octx)
	cancel()
	if err != nil {
		return nil, err
	}
	errc := make(chan error, 1)
	synced := make(chan struct{})
	go func() { errc <- p.Run(ctx, spec, synced) }()
	select {
	case <-synced:
		log.Info("following the InferencePool", "pool", pool, "namespace", namespace,
			"selector", spec.Selector.String(), "target_ports", spec.TargetPorts)
		return errc, nil
	case err := <-errc:
		if err == nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("InferencePool %q in namespace %q: %w", pool, namespace, err)
	}
}
