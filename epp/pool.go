package epp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/lm-warden/warden/live"
)

// PoolResource is the Gateway API Inference Extension's InferencePool,
// read through the dynamic client (no typed client of the extension is
// a dependency): group inference.networking.k8s.io, version v1.
var PoolResource = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

// PoolSpec is what the picker reads of an InferencePool: the fields of
// gateway-api-inference-extension api/v1/inferencepool_types.go
// (InferencePoolSpec) that say which endpoints it has.
type PoolSpec struct {
	// Selector is spec.selector.matchLabels: the pods of the pool, in the
	// pool's namespace (the v1 LabelSelector has matchLabels only, at
	// least one).
	Selector labels.Selector
	// TargetPorts is spec.targetPorts[].number: 1 to 8 distinct ports,
	// "every port will be treated as a distinctive endpoint by EPP,
	// addressable as a 'podIP:portNumber' combination" (one per vLLM
	// data-parallel rank).
	TargetPorts []int
}

// Equal reports whether p and o select the same pods on the same ports.
func (p PoolSpec) Equal(o PoolSpec) bool {
	return p.Selector.String() == o.Selector.String() && slices.Equal(p.TargetPorts, o.TargetPorts)
}

// ParsePoolSpec reads the selector and target ports of an InferencePool;
// an error names the pool and the field.
func ParsePoolSpec(u *unstructured.Unstructured) (PoolSpec, error) {
	where := fmt.Sprintf("InferencePool %q in namespace %q", u.GetName(), u.GetNamespace())
	ml, found, err := unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels")
	if err != nil {
		return PoolSpec{}, fmt.Errorf("%s: spec.selector.matchLabels: %w", where, err)
	}
	if !found || len(ml) == 0 {
		return PoolSpec{}, fmt.Errorf("%s: spec.selector.matchLabels is empty: the picker would take every pod of the namespace", where)
	}
	sel, err := labels.ValidatedSelectorFromSet(ml)
	if err != nil {
		return PoolSpec{}, fmt.Errorf("%s: spec.selector.matchLabels: %w", where, err)
	}
	raw, found, err := unstructured.NestedSlice(u.Object, "spec", "targetPorts")
	if err != nil {
		return PoolSpec{}, fmt.Errorf("%s: spec.targetPorts: %w", where, err)
	}
	if !found || len(raw) == 0 {
		return PoolSpec{}, fmt.Errorf("%s: spec.targetPorts is empty: want the model servers' ports, [{number: 8000}, ...]", where)
	}
	spec := PoolSpec{Selector: sel}
	for i, r := range raw {
		m, _ := r.(map[string]any)
		n, ok := portNumber(m["number"])
		if !ok || n < 1 || n > 65535 {
			return PoolSpec{}, fmt.Errorf("%s: spec.targetPorts[%d].number: %v is not a port (1 to 65535)", where, i, m["number"])
		}
		if slices.Contains(spec.TargetPorts, n) {
			return PoolSpec{}, fmt.Errorf("%s: spec.targetPorts[%d].number: %d is listed twice", where, i, n)
		}
		spec.TargetPorts = append(spec.TargetPorts, n)
	}
	return spec, nil
}

// portNumber reads a JSON number as decoded by apimachinery (int64) or by
// encoding/json (float64).
func portNumber(v any) (int, bool) {
	switch n := v.(type) {
	case int64:
		return int(n), true
	case int:
		return n, true
	case float64:
		return int(n), n == float64(int(n))
	}
	return 0, false
}

// Pool follows an InferencePool and its pods: Open reads the pool at
// start (where a picker that cannot read it should stop, with an error
// that names the pool and the namespace), Run follows the pool's ready
// pods (a Discovery on its selector and target ports) and the pool
// itself, so that a changed selector or changed target ports are
// followed, and hands every new set of endpoints to Apply.
type Pool struct {
	Core      kubernetes.Interface
	Dynamic   dynamic.Interface
	Namespace string
	Name      string
	Log       *slog.Logger
	// Apply gets the endpoints, ip:port, by pod name then port, at the
	// first sync and after every change (see Discovery.Apply).
	Apply func(endpoints []string) error
}

// Open reads the pool and checks that its pods can be listed.
func (p *Pool) Open(ctx context.Context) (PoolSpec, error) {
	u, err := p.Dynamic.Resource(PoolResource).Namespace(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		return PoolSpec{}, p.apiError("reading it", "get, list and watch on inferencepools.inference.networking.k8s.io", err)
	}
	spec, err := ParsePoolSpec(u)
	if err != nil {
		return PoolSpec{}, err
	}
	if _, err := p.Core.CoreV1().Pods(p.Namespace).List(ctx, metav1.ListOptions{LabelSelector: spec.Selector.String(), Limit: 1}); err != nil {
		return PoolSpec{}, p.apiError("listing its pods ("+spec.Selector.String()+")", "get, list and watch on pods", err)
	}
	return spec, nil
}

// apiError says what went wrong with the Kubernetes API in words that
// point at the fix.
func (p *Pool) apiError(doing, rbac string, err error) error {
	where := fmt.Sprintf("InferencePool %q in namespace %q", p.Name, p.Namespace)
	var ue *url.Error
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%s: not found (kubectl -n %s get inferencepools; the InferencePool CRD, inference.networking.k8s.io/v1, must be installed): %w", where, p.Namespace, err)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s: %s is forbidden: the picker's service account needs %s in namespace %q (a Role and RoleBinding as in deploy/kubernetes/rbac.yaml): %w", where, doing, rbac, p.Namespace, err)
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("%s: %s: the Kubernetes API server refused the picker's credentials: %w", where, doing, err)
	case errors.As(err, &ue):
		return fmt.Errorf("%s: %s: no Kubernetes API server reachable: %w", where, doing, err)
	}
	return fmt.Errorf("%s: %s: %w", where, doing, err)
}

// Run follows the pool from spec (what Open returned) until ctx is done.
// synced, when not nil, is closed once the first set of endpoints was
// applied. A pool deleted keeps its last endpoints (logged); a pool whose
// spec cannot be read keeps the last one it could.
func (p *Pool) Run(ctx context.Context, spec PoolSpec, synced chan<- struct{}) error {
	log := p.Log
	if log == nil {
		log = slog.Default()
	}
	log = log.With("pool", p.Name, "namespace", p.Namespace)
	inf := dynamicinformer.NewFilteredDynamicInformer(p.Dynamic, PoolResource, p.Namespace, 0, cache.Indexers{},
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", p.Name).String()
		})
	// The latest spec read, one at most (handlers run one at a time).
	specs := make(chan PoolSpec, 1)
	onPool := func(obj any) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok || u.GetName() != p.Name {
			return
		}
		s, err := ParsePoolSpec(u)
		if err != nil {
			log.Error("the InferencePool changed to a spec the picker cannot follow; keeping the last one", "err", err)
			return
		}
		select {
		case <-specs:
		default:
		}
		specs <- s
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    onPool,
		UpdateFunc: func(_, o any) { onPool(o) },
		DeleteFunc: func(any) {
			log.Error("the InferencePool was deleted; following the pods of its last spec")
		},
	}); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { inf.Informer().RunWithContext(ctx) })

	var once sync.Once
	apply := func(eps []string) error {
		if err := p.Apply(eps); err != nil {
			return err
		}
		if synced != nil {
			once.Do(func() { close(synced) })
		}
		return nil
	}
	for {
		dctx, stop := context.WithCancel(ctx)
		d := &Discovery{Client: p.Core, Namespace: p.Namespace, Selector: spec.Selector, TargetPorts: spec.TargetPorts, Log: log, Apply: apply}
		done := make(chan error, 1)
		go func() { done <- d.Run(dctx, nil) }()
	wait:
		for {
			select {
			case err := <-done:
				stop()
				if err == nil {
					err = ctx.Err()
				}
				if errors.Is(err, context.Canceled) {
					return nil
				}
				return err
			case s := <-specs:
				if s.Equal(spec) {
					continue
				}
				log.Info("the InferencePool changed; following its new pods", "selector", s.Selector.String(), "target_ports", s.TargetPorts)
				stop()
				if err := <-done; err != nil {
					return err
				}
				spec = s
				break wait
			}
		}
	}
}

// The endpoint a configuration read with ParsePoolConfig is validated
// with, in place of the pool's (TEST-NET-1, RFC 5737: never routed). It
// never reaches the picker: WithEndpoints replaces it.
const poolPlaceholder = "http://192.0.2.1:1"

// LoadPoolConfig reads the configuration of a picker whose endpoints are
// an InferencePool's pods (warden epp --kubernetes): the proxy's format
// and rules, with no replicas and no url under the models (the pool gives
// them). The models of the configuration it returns have no replicas;
// WithEndpoints gives them the pool's.
func LoadPoolConfig(path string) (*live.Config, error) {
	return LoadConfig(path, ConfigOptions{Kubernetes: true})
}

// ParsePoolConfig is LoadPoolConfig on data; name is used in errors.
func ParsePoolConfig(name string, data []byte) (*live.Config, error) {
	return ParseConfig(name, data, ConfigOptions{Kubernetes: true})
}
