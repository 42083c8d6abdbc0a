package kubernetes_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/lm-warden/warden/epp"
	"github.com/lm-warden/warden/live"
	"github.com/lm-warden/warden/sim"
)

// kustomization is the part of kustomize's Kustomization the manifests use.
type kustomization struct {
	APIVersion         string   `json:"apiVersion"`
	Kind               string   `json:"kind"`
	Namespace          string   `json:"namespace"`
	Resources          []string `json:"resources"`
	ConfigMapGenerator []struct {
		Name  string   `json:"name"`
		Files []string `json:"files"`
	} `json:"configMapGenerator"`
}

// bundle is every object of the manifests, decoded into its API type.
type bundle struct {
	kust       kustomization
	config     []byte // config/epp.yaml
	namespaces []corev1.Namespace
	deploys    []appsv1.Deployment
	services   []corev1.Service
	accounts   []corev1.ServiceAccount
	roles      []rbacv1.Role
	bindings   []rbacv1.RoleBinding
	pools      []infv1.InferencePool        // inference.networking.k8s.io/v1, the extension's own Go types
	poolObjs   []*unstructured.Unstructured // the same, as the picker reads them from the API server
	routes     []*unstructured.Unstructured // gateway.networking.k8s.io/v1 HTTPRoute
	objects    []metav1.Object
}

// strict decodes JSON into v, refusing unknown fields (a misspelt key in
// a manifest is an error, as kubectl apply --validate=strict makes it).
func strict(data []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	return d.Decode(v)
}

// parse decodes the manifests in files (path relative to
// deploy/kubernetes -> content): kustomization.yaml, every resource it
// lists, the configuration its configMapGenerator takes.
func parse(files map[string][]byte) (*bundle, error) {
	b := &bundle{}
	kj, err := utilyaml.ToJSON(files["kustomization.yaml"])
	if err != nil {
		return nil, fmt.Errorf("kustomization.yaml: %w", err)
	}
	if err := strict(kj, &b.kust); err != nil {
		return nil, fmt.Errorf("kustomization.yaml: %w", err)
	}
	if b.kust.Kind != "Kustomization" || b.kust.Namespace == "" {
		return nil, fmt.Errorf("kustomization.yaml: want a Kustomization with a namespace")
	}
	// Every manifest here is listed, so that kubectl apply -k applies it.
	listed := map[string]bool{"kustomization.yaml": true}
	for _, r := range b.kust.Resources {
		listed[r] = true
	}
	for _, g := range b.kust.ConfigMapGenerator {
		for _, f := range g.Files {
			listed[f] = true
		}
	}
	for name := range files {
		if !listed[name] {
			return nil, fmt.Errorf("%s is in deploy/kubernetes but not in kustomization.yaml", name)
		}
	}
	for _, r := range b.kust.Resources {
		data, ok := files[r]
		if !ok {
			return nil, fmt.Errorf("kustomization.yaml: resource %s does not exist", r)
		}
		if err := b.add(r, data); err != nil {
			return nil, err
		}
	}
	if len(b.kust.ConfigMapGenerator) != 1 || len(b.kust.ConfigMapGenerator[0].Files) != 1 {
		return nil, fmt.Errorf("kustomization.yaml: want one configMapGenerator with one file, the picker's configuration")
	}
	cfgFile := b.kust.ConfigMapGenerator[0].Files[0]
	if b.config = files[cfgFile]; b.config == nil {
		return nil, fmt.Errorf("kustomization.yaml: configMapGenerator file %s does not exist", cfgFile)
	}
	b.setNamespace()
	return b, nil
}

// setNamespace does what kustomize's namespace: does (its namespace
// transformer): every namespaced object goes to kustomization.yaml's
// namespace, whatever its file says, and a Namespace object is renamed
// to it. What a file names beyond metadata (a URL in the configuration, a
// subject's namespace) is not rewritten: check finds it.
func (b *bundle) setNamespace() {
	for _, o := range b.objects {
		if _, isNS := o.(*corev1.Namespace); isNS {
			o.SetName(b.kust.Namespace)
			continue
		}
		o.SetNamespace(b.kust.Namespace)
	}
	for _, u := range b.poolObjs {
		u.SetNamespace(b.kust.Namespace)
	}
}

// add decodes each document of one manifest file into its API type.
func (b *bundle) add(name string, data []byte) error {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		j, err := utilyaml.ToJSON(doc)
		if err != nil {
			return fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		if string(bytes.TrimSpace(j)) == "null" {
			continue // comments only
		}
		var tm metav1.TypeMeta
		if err := json.Unmarshal(j, &tm); err != nil {
			return fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		where := fmt.Sprintf("%s: %s %s", name, tm.APIVersion, tm.Kind)
		var obj metav1.Object
		switch tm.APIVersion + " " + tm.Kind {
		case "v1 Namespace":
			err = decodeInto(j, &b.namespaces, &obj)
		case "apps/v1 Deployment":
			err = decodeInto(j, &b.deploys, &obj)
		case "v1 Service":
			err = decodeInto(j, &b.services, &obj)
		case "v1 ServiceAccount":
			err = decodeInto(j, &b.accounts, &obj)
		case "rbac.authorization.k8s.io/v1 Role":
			err = decodeInto(j, &b.roles, &obj)
		case "rbac.authorization.k8s.io/v1 RoleBinding":
			err = decodeInto(j, &b.bindings, &obj)
		case "inference.networking.k8s.io/v1 InferencePool":
			// Strictly into the extension's own type (its real schema:
			// gateway-api-inference-extension api/v1), and as the
			// picker's --kubernetes reads it.
			if err = decodeInto(j, &b.pools, &obj); err == nil {
				u := &unstructured.Unstructured{}
				err = u.UnmarshalJSON(j)
				b.poolObjs = append(b.poolObjs, u)
			}
		case "gateway.networking.k8s.io/v1 HTTPRoute":
			u := &unstructured.Unstructured{}
			if err = u.UnmarshalJSON(j); err == nil {
				b.routes, obj = append(b.routes, u), u
			}
		default:
			return fmt.Errorf("%s: a kind this test does not know", where)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		b.objects = append(b.objects, obj)
	}
}

// decodeInto decodes j strictly as a T, appends it to list and points obj
// at it (for its metadata).
func decodeInto[T any, PT interface {
	*T
	metav1.Object
}](j []byte, list *[]T, obj *metav1.Object) error {
	var v T
	if err := strict(j, &v); err != nil {
		return err
	}
	*list = append(*list, v)
	*obj = PT(&(*list)[len(*list)-1])
	return nil
}

func one[T any](kind string, list []T) (*T, error) {
	if len(list) != 1 {
		return nil, fmt.Errorf("want one %s, have %d", kind, len(list))
	}
	return &list[0], nil
}

func deployment(b *bundle, name string) (*appsv1.Deployment, error) {
	for i := range b.deploys {
		if b.deploys[i].Name == name {
			return &b.deploys[i], nil
		}
	}
	return nil, fmt.Errorf("no Deployment %q", name)
}

func service(b *bundle, name string) (*corev1.Service, error) {
	for i := range b.services {
		if b.services[i].Name == name {
			return &b.services[i], nil
		}
	}
	return nil, fmt.Errorf("no Service %q", name)
}

// flagValue is the value of --name=V or --name V in args.
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v, true
		}
		if a == name && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

// containerPort resolves a Service's or probe's target port (a number or
// a port name) in the pod.
func containerPort(pod *corev1.PodSpec, p intstr.IntOrString) (int32, bool) {
	for _, c := range pod.Containers {
		for _, cp := range c.Ports {
			if (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) || (p.Type == intstr.String && cp.Name == p.StrVal) {
				return cp.ContainerPort, true
			}
		}
	}
	return 0, false
}

func portOf(addr string) (int32, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(p)
	return int32(n), err
}

// check returns what does not agree in the manifests.
func check(b *bundle) error {
	ns := b.kust.Namespace
	for _, d := range b.deploys {
		sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
		if err != nil || sel.Empty() || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			return fmt.Errorf("Deployment %s: spec.selector does not select its own pods (%v)", d.Name, err)
		}
	}

	// The pool, as the picker reads it (the very code of --kubernetes),
	// and in the extension's own type.
	pool, err := one("InferencePool", b.pools)
	if err != nil {
		return err
	}
	spec, err := epp.ParsePoolSpec(b.poolObjs[0])
	if err != nil {
		return err
	}
	if n := len(pool.Spec.TargetPorts); n != 1 {
		// gateway-api-inference-extension v1.0.x's CRD allows one
		// (MaxItems=1); several need v1.1.0 and a gateway that passes the
		// data-parallel conformance test (inferencepool.yaml says which).
		return fmt.Errorf("InferencePool %s: %d targetPorts: the first v1 CRD (gateway-api-inference-extension v1.0.x) and gateways without the data-parallel conformance test refuse more than one", pool.Name, n)
	}

	// The model servers: the pool's pods, one port per data-parallel rank.
	var vllm *appsv1.Deployment
	for i := range b.deploys {
		if spec.Selector.Matches(labels.Set(b.deploys[i].Spec.Template.Labels)) {
			if vllm != nil {
				return fmt.Errorf("the pool's selector %s takes the pods of two Deployments, %s and %s", spec.Selector, vllm.Name, b.deploys[i].Name)
			}
			vllm = &b.deploys[i]
		}
	}
	if vllm == nil {
		return fmt.Errorf("InferencePool %s: its selector %s matches no Deployment's pod labels", pool.GetName(), spec.Selector)
	}
	var ports []int
	var model string
	ranks := map[string]bool{}
	if err := vllmPod(vllm); err != nil {
		return err
	}
	for _, c := range vllm.Spec.Template.Spec.Containers {
		if len(c.Ports) != 1 {
			return fmt.Errorf("Deployment %s: container %s: want one port, its rank's", vllm.Name, c.Name)
		}
		cp := c.Ports[0].ContainerPort
		ports = append(ports, int(cp))
		args := append(slices.Clone(c.Command), c.Args...)
		if p, _ := flagValue(args, "--port"); p != strconv.Itoa(int(cp)) {
			return fmt.Errorf("Deployment %s: container %s: vLLM's --port is %q, its containerPort %d", vllm.Name, c.Name, p, cp)
		}
		if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Port.IntValue() != int(cp) {
			return fmt.Errorf("Deployment %s: container %s: want a readiness probe on /health at port %d (the picker takes Ready pods only)", vllm.Name, c.Name, cp)
		}
		if dp, ok := flagValue(args, "--data-parallel-size"); ok && dp != strconv.Itoa(len(vllm.Spec.Template.Spec.Containers)) {
			return fmt.Errorf("Deployment %s: container %s: --data-parallel-size %q, the pod runs %d ranks", vllm.Name, c.Name, dp, len(vllm.Spec.Template.Spec.Containers))
		}
		if rank, ok := flagValue(args, "--data-parallel-rank"); ok && ranks[rank] {
			return fmt.Errorf("Deployment %s: container %s: --data-parallel-rank %q twice", vllm.Name, c.Name, rank)
		} else if ok {
			ranks[rank] = true
		}
		if len(c.Args) == 0 || strings.HasPrefix(c.Args[0], "-") {
			return fmt.Errorf("Deployment %s: container %s: want the model first in args", vllm.Name, c.Name)
		}
		if model != "" && c.Args[0] != model {
			return fmt.Errorf("Deployment %s: container %s serves %s, another %s", vllm.Name, c.Name, c.Args[0], model)
		}
		model = c.Args[0]
	}
	if !slices.Equal(ports, spec.TargetPorts) {
		return fmt.Errorf("InferencePool %s: targetPorts %v, the vLLM pods' container ports %v", pool.GetName(), spec.TargetPorts, ports)
	}

	// The picker: the pool's endpointPickerRef names its Service and port.
	ref := pool.Spec.EndpointPickerRef
	if ref == nil || ref.Port == nil {
		return fmt.Errorf("InferencePool %s: want an endpointPickerRef with a port", pool.Name)
	}
	refName := string(ref.Name)
	if ref.Kind != "" && ref.Kind != "Service" {
		return fmt.Errorf("InferencePool %s: endpointPickerRef.kind %q, want Service", pool.GetName(), ref.Kind)
	}
	refPort := int64(ref.Port.Number)
	if fm := ref.FailureMode; fm != "" && fm != infv1.EndpointPickerFailOpen && fm != infv1.EndpointPickerFailClose {
		return fmt.Errorf("InferencePool %s: endpointPickerRef.failureMode %q, want FailOpen or FailClose", pool.GetName(), fm)
	}
	svc, err := service(b, refName)
	if err != nil {
		return fmt.Errorf("InferencePool %s: endpointPickerRef names Service %q: %w", pool.GetName(), refName, err)
	}
	var eppDep *appsv1.Deployment
	for i := range b.deploys {
		if labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(b.deploys[i].Spec.Template.Labels)) && len(svc.Spec.Selector) > 0 {
			eppDep = &b.deploys[i]
		}
	}
	if eppDep == nil {
		return fmt.Errorf("Service %s: its selector %v matches no Deployment's pods", svc.Name, svc.Spec.Selector)
	}
	eppPod := &eppDep.Spec.Template.Spec
	var grpcPort int32
	for _, p := range svc.Spec.Ports {
		if int64(p.Port) == refPort {
			if grpcPort, _ = containerPort(eppPod, p.TargetPort); grpcPort == 0 {
				return fmt.Errorf("Service %s: port %d's targetPort %s is no port of Deployment %s", svc.Name, p.Port, p.TargetPort.String(), eppDep.Name)
			}
		}
	}
	if grpcPort == 0 {
		return fmt.Errorf("InferencePool %s: endpointPickerRef port %d is no port of Service %s", pool.GetName(), refPort, svc.Name)
	}
	if len(eppPod.Containers) != 1 {
		return fmt.Errorf("Deployment %s: want one container, warden", eppDep.Name)
	}
	c := eppPod.Containers[0]
	args := append(slices.Clone(c.Command), c.Args...)
	if !slices.Contains(args, "epp") || !slices.Contains(args, "--kubernetes") {
		return fmt.Errorf("Deployment %s: args %v: want warden epp --kubernetes", eppDep.Name, args)
	}
	if p, _ := flagValue(args, "--pool"); p != pool.GetName() {
		return fmt.Errorf("Deployment %s: --pool %q, the InferencePool is %q", eppDep.Name, p, pool.GetName())
	}
	if n, ok := flagValue(args, "--namespace"); ok && n != ns {
		return fmt.Errorf("Deployment %s: --namespace %q, the pool's is %q", eppDep.Name, n, ns)
	}
	// The probes ask the health port, --health-listen, a port of the pod.
	healthAddr, _ := flagValue(args, "--health-listen")
	healthPort, err := portOf(healthAddr)
	if err != nil {
		return fmt.Errorf("Deployment %s: --health-listen %q: %v", eppDep.Name, healthAddr, err)
	}
	if _, ok := containerPort(eppPod, intstr.FromInt32(healthPort)); !ok {
		return fmt.Errorf("Deployment %s: --health-listen port %d is no container port", eppDep.Name, healthPort)
	}
	for _, pr := range []struct {
		name    string
		probe   *corev1.Probe
		service string
	}{{"readinessProbe", c.ReadinessProbe, "readiness"}, {"livenessProbe", c.LivenessProbe, "liveness"}} {
		if pr.probe == nil || pr.probe.GRPC == nil || pr.probe.GRPC.Port != healthPort || pr.probe.GRPC.Service == nil || *pr.probe.GRPC.Service != pr.service {
			return fmt.Errorf("Deployment %s: %s: want gRPC health service %q on port %d", eppDep.Name, pr.name, pr.service, healthPort)
		}
	}
	// --service names the Service that exposes the admin port, so that a
	// scrape by its DNS name is answered (403 otherwise).
	adminPort := intstr.FromString("admin")
	if sn, _ := flagValue(args, "--service"); sn != svc.Name || !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.TargetPort == adminPort }) {
		return fmt.Errorf("Deployment %s: --service %q: want %s, the Service of its admin port", eppDep.Name, sn, svc.Name)
	}
	// session_key comes from a Secret mounted where --session-key-file
	// reads it.
	keyPath, _ := flagValue(args, "--session-key-file")
	var keyMounted bool
	for _, m := range c.VolumeMounts {
		for _, v := range eppPod.Volumes {
			if v.Name != m.Name || v.Secret == nil {
				continue
			}
			for _, it := range v.Secret.Items {
				if keyPath == path.Join(m.MountPath, it.Path) {
					keyMounted = true
				}
			}
		}
	}
	if !keyMounted {
		return fmt.Errorf("Deployment %s: --session-key-file %q is no key of a mounted Secret", eppDep.Name, keyPath)
	}

	// Its configuration: the ConfigMap the generator makes, mounted where
	// --config reads it, accepted as warden epp --check --kubernetes
	// accepts it, listening where the Service sends.
	gen := b.kust.ConfigMapGenerator[0]
	cfgPath, _ := flagValue(args, "--config")
	var mounted bool
	for _, m := range c.VolumeMounts {
		for _, v := range eppPod.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == gen.Name && cfgPath == path.Join(m.MountPath, path.Base(gen.Files[0])) {
				mounted = true
			}
		}
	}
	if !mounted {
		return fmt.Errorf("Deployment %s: --config %s is not the ConfigMap %s's %s", eppDep.Name, cfgPath, gen.Name, path.Base(gen.Files[0]))
	}
	// As the picker reads it with the Secret's key: no key of its own,
	// and none that is a placeholder.
	cfg, err := epp.ParseConfig(path.Base(gen.Files[0]), b.config, epp.ConfigOptions{Kubernetes: true, Keys: live.KeyOptions{Key: "a-key-as-the-secret-gives-it"}})
	if err != nil {
		return err
	}
	if p, err := portOf(cfg.Admin); err != nil {
		return err
	} else if cp, _ := containerPort(eppPod, adminPort); cp != p {
		return fmt.Errorf("%s: admin %s, the pod's admin port is %d", gen.Files[0], cfg.Admin, cp)
	}
	if p, err := portOf(cfg.Listen); err != nil || p != grpcPort {
		return fmt.Errorf("%s: listen %s, the Service sends the gateway to port %d", gen.Files[0], cfg.Listen, grpcPort)
	}
	if len(cfg.Models) != 1 || cfg.Models[0].Name != model {
		return fmt.Errorf("%s: want one model, %s, the one the vLLM pods serve", gen.Files[0], model)
	}
	seqs, _ := flagValue(append(slices.Clone(vllm.Spec.Template.Spec.Containers[0].Command), vllm.Spec.Template.Spec.Containers[0].Args...), "--max-num-seqs")
	if m := cfg.Models[0].MaxNumSeqs; m != 0 && strconv.Itoa(m) != seqs {
		return fmt.Errorf("%s: max_num_seqs %d, vLLM's --max-num-seqs %q", gen.Files[0], m, seqs)
	}
	if cfg.SessionStore != "" {
		u, err := url.Parse(cfg.SessionStore)
		if err != nil {
			return err
		}
		host, port, _ := net.SplitHostPort(u.Host)
		// The Service's name alone (the pod's own namespace, wherever
		// kustomization.yaml puts it), or qualified with that namespace.
		name, rest, _ := strings.Cut(host, ".")
		rs, err := service(b, name)
		if err != nil || rest != "" && !strings.HasPrefix(rest, ns+".") && rest != ns {
			return fmt.Errorf("%s: session_store %s is no Service of namespace %s", gen.Files[0], cfg.SessionStore, ns)
		}
		if !slices.ContainsFunc(rs.Spec.Ports, func(p corev1.ServicePort) bool { return strconv.Itoa(int(p.Port)) == port }) {
			return fmt.Errorf("%s: session_store port %s is no port of Service %s", gen.Files[0], port, name)
		}
	}

	// RBAC: the Deployment's service account may get, list and watch the
	// pods and the inferencepools of the namespace.
	sa, err := one("ServiceAccount", b.accounts)
	if err != nil {
		return err
	}
	if eppPod.ServiceAccountName != sa.Name {
		return fmt.Errorf("Deployment %s: serviceAccountName %q, the ServiceAccount is %q", eppDep.Name, eppPod.ServiceAccountName, sa.Name)
	}
	rb, err := one("RoleBinding", b.bindings)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(rb.Subjects, func(s rbacv1.Subject) bool {
		// No namespace: the RoleBinding's own.
		return s.Kind == "ServiceAccount" && s.Name == sa.Name && (s.Namespace == ns || s.Namespace == "")
	}) {
		return fmt.Errorf("RoleBinding %s does not bind ServiceAccount %s/%s", rb.Name, ns, sa.Name)
	}
	role, err := one("Role", b.roles)
	if err != nil {
		return err
	}
	if rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != role.Name || rb.RoleRef.APIGroup != rbacv1.GroupName {
		return fmt.Errorf("RoleBinding %s: roleRef %s %s, the Role is %s", rb.Name, rb.RoleRef.Kind, rb.RoleRef.Name, role.Name)
	}
	for _, need := range []struct{ group, resource string }{{"", "pods"}, {epp.PoolResource.Group, epp.PoolResource.Resource}} {
		for _, verb := range []string{"get", "list", "watch"} {
			if !slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool {
				return slices.Contains(r.APIGroups, need.group) && slices.Contains(r.Resources, need.resource) && slices.Contains(r.Verbs, verb)
			}) {
				return fmt.Errorf("Role %s does not grant %s on %s (group %q)", role.Name, verb, need.resource, need.group)
			}
		}
	}

	// The route sends the gateway's traffic to the pool.
	route, err := one("HTTPRoute", b.routes)
	if err != nil {
		return err
	}
	rules, _, _ := unstructured.NestedSlice((*route).Object, "spec", "rules")
	var toPool bool
	for _, r := range rules {
		refs, _, _ := unstructured.NestedSlice(r.(map[string]any), "backendRefs")
		for _, br := range refs {
			m := br.(map[string]any)
			if m["group"] == epp.PoolResource.Group && m["kind"] == "InferencePool" && m["name"] == pool.GetName() {
				toPool = true
			}
		}
	}
	if !toPool {
		return fmt.Errorf("HTTPRoute %s: no backendRef is InferencePool %s", (*route).GetName(), pool.GetName())
	}
	if parents, _, _ := unstructured.NestedSlice((*route).Object, "spec", "parentRefs"); len(parents) == 0 {
		return fmt.Errorf("HTTPRoute %s: no parentRefs (the Gateway)", (*route).GetName())
	}
	return nil
}

// readManifests reads deploy/kubernetes: every YAML file, by its path
// relative to the directory.
func readManifests(t *testing.T) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(".", func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || (filepath.Ext(p) != ".yaml" && filepath.Ext(p) != ".yml") {
			return err
		}
		data, err := os.ReadFile(p)
		files[filepath.ToSlash(p)] = data
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestManifestsAgree parses every manifest of deploy/kubernetes with the
// Kubernetes API types (strictly: an unknown field is an error) and checks
// that names and ports agree: the pool's selector takes the vLLM pods,
// its targetPorts are their container ports, its endpointPickerRef is the
// picker's Service and gRPC port, the picker runs --kubernetes on that
// pool with the ConfigMap's configuration, which warden epp --check
// --kubernetes accepts, as its service account, bound to a Role that may
// read pods and inferencepools; the route goes to the pool.
func TestManifestsAgree(t *testing.T) {
	b, err := parse(readManifests(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := check(b); err != nil {
		t.Fatal(err)
	}
	if len(b.objects) != 11 {
		t.Errorf("%d objects, want the 11 of the manifests (a document lost?)", len(b.objects))
	}
}

// TestManifestsMismatch: each mutated copy of the manifests, one name or
// port changed, is refused, naming what disagrees.
func TestManifestsMismatch(t *testing.T) {
	base := readManifests(t)
	for _, tt := range []struct {
		name, file, old, new, want string
	}{
		{"selector", "inferencepool.yaml", "app: vllm-qwen3", "app: vllm-llama", "its selector app=vllm-llama matches no Deployment's pod labels"},
		{"pod labels", "vllm.yaml", "app: vllm-qwen3 # inferencepool", "app: vllm-other # inferencepool", "spec.selector does not select its own pods"},
		{"target port", "inferencepool.yaml", "number: 8000", "number: 8002", "targetPorts [8002], the vLLM pods' container ports [8000]"},
		{"two target ports", "inferencepool.yaml", "    - number: 8000\n", "    - number: 8000\n    - number: 8001\n", "2 targetPorts: the first v1 CRD (gateway-api-inference-extension v1.0.x)"},
		{"pool field", "inferencepool.yaml", "failureMode: FailClose", "failureMode: FailClose\n    timeout: 5s", `InferencePool: json: unknown field "timeout"`},
		{"vllm port arg", "vllm.yaml", "--port=8000", "--port=8003", "vLLM's --port is \"8003\", its containerPort 8000"},
		{"dp size", "vllm.yaml", "--port=8000\n", "--port=8000\n            - --data-parallel-size=2\n", "--data-parallel-size \"2\", the pod runs 1 ranks"},
		{"vllm image", "vllm.yaml", "vllm/vllm-openai:v0.26.0", "vllm/vllm-openai:v0.11.0", "image vllm/vllm-openai:v0.11.0: want vLLM 0.26"},
		{"no shm", "vllm.yaml", "            - name: dshm\n              mountPath: /dev/shm\n", "", "want /dev/shm from an emptyDir in memory"},
		{"no model cache", "vllm.yaml", "              mountPath: /models\n", "              mountPath: /cache\n", "want a volume at the model cache /models"},
		{"no startup probe", "vllm.yaml", "startupProbe:", "readinessGates: []\n          x:", "unknown field"},
		{"startup probe path", "vllm.yaml", "startupProbe:\n            httpGet: {path: /health", "startupProbe:\n            httpGet: {path: /v1/models", "want a startup probe on /health"},
		{"epp ref port", "inferencepool.yaml", "number: 9002", "number: 9003", "endpointPickerRef port 9003 is no port of Service warden-epp"},
		{"epp ref name", "inferencepool.yaml", "name: warden-epp", "name: warden-picker", `endpointPickerRef names Service "warden-picker"`},
		{"failure mode", "inferencepool.yaml", "failureMode: FailClose", "failureMode: FailSafe", "failureMode \"FailSafe\""},
		{"service target", "epp.yaml", "targetPort: grpc", "targetPort: grpcs", "targetPort grpcs is no port of Deployment warden-epp"},
		{"pool arg", "epp.yaml", "--pool, qwen3-pool,", "--pool, qwen-pool,", `--pool "qwen-pool", the InferencePool is "qwen3-pool"`},
		{"service arg", "epp.yaml", "--service, warden-epp,", "--service, warden,", `--service "warden": want warden-epp, the Service of its admin port`},
		{"key file", "epp.yaml", "--session-key-file, /etc/warden-secret/session-key", "--session-key-file, /etc/warden/session-key", `--session-key-file "/etc/warden/session-key" is no key of a mounted Secret`},
		{"placeholder key", "config/epp.yaml", "session_store:", "session_key: change-me-to-a-long-random-string\nsession_store:", `session_key: "change-me-to-a-long-random-string" is a placeholder`},
		{"key in the file", "config/epp.yaml", "session_store:", "session_key: 0f3a9c61d2b84e57a6c1\nsession_store:", "session_key: given twice"},
		{"health port", "epp.yaml", `--health-listen, "0.0.0.0:9003"`, `--health-listen, "0.0.0.0:9004"`, "--health-listen port 9004 is no container port"},
		{"no kubernetes", "epp.yaml", "--kubernetes, ", "", "want warden epp --kubernetes"},
		{"probe port", "epp.yaml", "grpc: {port: 9003, service: readiness}", "grpc: {port: 9002, service: readiness}", "readinessProbe: want gRPC health service \"readiness\" on port 9003"},
		{"config path", "epp.yaml", "--config, /etc/warden/epp.yaml", "--config, /etc/warden/warden.yaml", "--config /etc/warden/warden.yaml is not the ConfigMap warden-epp-config's epp.yaml"},
		{"configmap name", "epp.yaml", "name: warden-epp-config", "name: warden-config", "is not the ConfigMap warden-epp-config's"},
		{"listen", "config/epp.yaml", "listen: 0.0.0.0:9002", "listen: 0.0.0.0:9000", "listen 0.0.0.0:9000, the Service sends the gateway to port 9002"},
		{"config invalid", "config/epp.yaml", "strategy: affinity", "strategy: sticky", "epp.yaml:36: models[0].strategy"},
		{"config replicas", "config/epp.yaml", "    gpu: H100\n", "    gpu: H100\n    replicas: [http://10.0.0.1:8000]\n", "models[0].replicas: with --kubernetes"},
		{"model", "config/epp.yaml", "name: Qwen/Qwen3-4B-Instruct-2507", "name: Qwen/Qwen3-8B", "want one model, Qwen/Qwen3-4B-Instruct-2507"},
		{"max num seqs", "config/epp.yaml", "max_num_seqs: 256", "max_num_seqs: 512", "max_num_seqs 512, vLLM's --max-num-seqs \"256\""},
		{"session store", "config/epp.yaml", "redis://warden-redis:6379/0", "redis://redis:6379/0", "session_store redis://redis:6379/0 is no Service"},
		{"session store namespace", "config/epp.yaml", "redis://warden-redis:6379/0", "redis://warden-redis.default.svc:6379/0", "is no Service of namespace llm"},
		{"service account", "epp.yaml", "serviceAccountName: warden-epp", "serviceAccountName: default", `serviceAccountName "default", the ServiceAccount is "warden-epp"`},
		{"binding subject", "rbac.yaml", "name: warden-epp # epp.yaml's serviceAccountName", "name: warden # epp.yaml's serviceAccountName", "RoleBinding warden-epp does not bind ServiceAccount llm/warden-epp"},
		{"role verbs", "rbac.yaml", "resources: [inferencepools]\n    verbs: [get, list, watch]", "resources: [inferencepools]\n    verbs: [get]", "Role warden-epp does not grant list on inferencepools"},
		{"route backend", "httproute.yaml", "name: qwen3-pool # inferencepool.yaml", "name: qwen-pool", "no backendRef is InferencePool qwen3-pool"},
		{"unknown field", "vllm.yaml", "readinessProbe:", "readynessProbe:", `unknown field "readynessProbe"`},
		{"unlisted", "kustomization.yaml", "  - redis.yaml ", "  # redis.yaml ", "redis.yaml is in deploy/kubernetes but not in kustomization.yaml"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			files := map[string][]byte{}
			for k, v := range base {
				files[k] = v
			}
			if !bytes.Contains(files[tt.file], []byte(tt.old)) {
				t.Fatalf("%s has no %q to change", tt.file, tt.old)
			}
			files[tt.file] = bytes.Replace(files[tt.file], []byte(tt.old), []byte(tt.new), 1)
			b, err := parse(files)
			if err == nil {
				err = check(b)
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v\nwant an error containing %q", err, tt.want)
			}
		})
	}
}

// vllmPod checks the model servers' pod as vLLM's own Kubernetes guide
// has it (docs/deployment/k8s.md): the release warden's model follows,
// shared memory at /dev/shm, a model cache, a startup probe on /health.
func vllmPod(d *appsv1.Deployment) error {
	pod := &d.Spec.Template.Spec
	volume := func(name string) *corev1.Volume {
		for i := range pod.Volumes {
			if pod.Volumes[i].Name == name {
				return &pod.Volumes[i]
			}
		}
		return nil
	}
	want, err := sim.ParseVLLMVersion(sim.DefaultVLLMVersion)
	if err != nil {
		return err
	}
	for _, c := range pod.Containers {
		where := fmt.Sprintf("Deployment %s: container %s", d.Name, c.Name)
		_, tag, _ := strings.Cut(c.Image, ":")
		if v, err := sim.ParseVLLMVersion(tag); err != nil || v != want {
			return fmt.Errorf("%s: image %s: want vLLM %s, the release warden's model follows (sim.DefaultVLLMVersion)", where, c.Image, sim.DefaultVLLMVersion)
		}
		cache := "/root/.cache/huggingface"
		for _, e := range c.Env {
			if e.Name == "HF_HOME" {
				cache = e.Value
			}
		}
		var shm, models bool
		for _, m := range c.VolumeMounts {
			v := volume(m.Name)
			switch {
			case v == nil:
			case m.MountPath == "/dev/shm":
				shm = v.EmptyDir != nil && v.EmptyDir.Medium == corev1.StorageMediumMemory
			case m.MountPath == cache:
				models = v.EmptyDir != nil || v.PersistentVolumeClaim != nil || v.HostPath != nil
			}
		}
		if !shm {
			return fmt.Errorf("%s: want /dev/shm from an emptyDir in memory (the runtime's 64 MiB is too small for PyTorch)", where)
		}
		if !models {
			return fmt.Errorf("%s: want a volume at the model cache %s", where, cache)
		}
		if c.StartupProbe == nil || c.StartupProbe.HTTPGet == nil || c.StartupProbe.HTTPGet.Path != "/health" {
			return fmt.Errorf("%s: want a startup probe on /health (loading the weights takes minutes)", where)
		}
	}
	return nil
}

// TestManifestsMoveNamespace: kustomization.yaml's namespace moves every
// object, and nothing in the manifests stays behind at the old one
// (issue 50, item 6: the session store's URL named llm, so in another
// namespace the pickers reached no Redis).
func TestManifestsMoveNamespace(t *testing.T) {
	files := readManifests(t)
	files["kustomization.yaml"] = bytes.Replace(files["kustomization.yaml"], []byte("\nnamespace: llm\n"), []byte("\nnamespace: prod\n"), 1)
	b, err := parse(files)
	if err != nil {
		t.Fatal(err)
	}
	if err := check(b); err != nil {
		t.Fatalf("in namespace prod: %v", err)
	}
	// A store named with the old namespace is found.
	files["config/epp.yaml"] = bytes.Replace(files["config/epp.yaml"], []byte("redis://warden-redis:6379/0"), []byte("redis://warden-redis.llm.svc:6379/0"), 1)
	if b, err = parse(files); err == nil {
		err = check(b)
	}
	if err == nil || !strings.Contains(err.Error(), "session_store redis://warden-redis.llm.svc:6379/0 is no Service of namespace prod") {
		t.Errorf("a store left in namespace llm: %v", err)
	}
}
