package epp

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/lm-warden/warden/live"
)

// Discovery follows the pods of an InferencePool through the Kubernetes
// API (a client-go informer on the pool's selector) and hands the
// endpoints of its ready pods, one per pod and target port, to Apply
// whenever they change. The pool's selector and target ports are given
// (spec.selector.matchLabels and spec.targetPorts, as Pool reads them
// from the InferencePool and gives them again when they change).
type Discovery struct {
	Client      kubernetes.Interface
	Namespace   string
	Selector    labels.Selector
	TargetPorts []int
	Resync      time.Duration // 0: none (watch events only)
	Log         *slog.Logger
	// Apply gets the endpoints (ip:port, by pod name then port) at the
	// first sync and after every change; an error is logged and the same
	// set is offered again at the next change.
	Apply func(endpoints []string) error
}

// Run follows the pods until ctx is done. synced, when not nil, is
// closed once the first set was applied.
func (d *Discovery) Run(ctx context.Context, synced chan<- struct{}) error {
	if d.Selector == nil || d.Selector.Empty() {
		return fmt.Errorf("epp: kubernetes discovery needs the pool's selector (a selector that is empty would take every pod of the namespace)")
	}
	if len(d.TargetPorts) == 0 {
		return fmt.Errorf("epp: kubernetes discovery needs the pool's target ports")
	}
	log := d.Log
	if log == nil {
		log = slog.Default()
	}
	f := informers.NewSharedInformerFactoryWithOptions(d.Client, d.Resync, informers.WithNamespace(d.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = d.Selector.String() }))
	pods := f.Core().V1().Pods()
	inf := pods.Informer()
	changed := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: poke}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil // ctx done
	}
	var last []string
	first := true
	for {
		list, err := pods.Lister().List(d.Selector)
		if err != nil {
			return err
		}
		eps := ReadyEndpoints(list, d.TargetPorts)
		if first || !slices.Equal(eps, last) {
			if err := d.Apply(eps); err != nil {
				log.Error("kubernetes discovery: applying the pool's endpoints failed", "endpoints", len(eps), "err", err)
			} else {
				log.Info("kubernetes discovery: the pool's endpoints", "endpoints", len(eps))
				last = eps
				if first && synced != nil {
					close(synced)
				}
				first = false
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// ReadyEndpoints lists ip:port for each pod that is ready (Running, its
// Ready condition true, an IP, not being deleted) and each target port,
// by pod name then port order.
func ReadyEndpoints(pods []*corev1.Pod, ports []int) []string {
	ready := slices.DeleteFunc(slices.Clone(pods), func(p *corev1.Pod) bool { return !podReady(p) })
	slices.SortFunc(ready, func(a, b *corev1.Pod) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	var out []string
	for _, p := range ready {
		for _, port := range ports {
			out = append(out, net.JoinHostPort(p.Status.PodIP, strconv.Itoa(port)))
		}
	}
	return out
}

func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.PodIP == "" || p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// WithEndpoints is base with every model's replicas replaced by the
// endpoints (http://ip:port): what a discovery change reloads, as a
// SIGHUP would, so that the sessions homed on endpoints that remain keep
// their homes.
func WithEndpoints(base *live.Config, endpoints []string) *live.Config {
	cfg := *base
	cfg.Models = slices.Clone(base.Models)
	urls := make([]string, len(endpoints))
	for i, e := range endpoints {
		urls[i] = "http://" + e
	}
	for i := range cfg.Models {
		cfg.Models[i].Replicas = urls
	}
	return &cfg
}
