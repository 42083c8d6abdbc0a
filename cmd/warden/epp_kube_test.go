package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/lm-warden/warden/epp"
	"github.com/lm-warden/warden/live"
)

const kubeModel = "Qwen/Qwen3-4B-Instruct-2507"

// kubePool is an InferencePool as the API server serves it
// (inference.networking.k8s.io/v1).
func kubePool(ns, name string, ports ...int64) *unstructured.Unstructured {
	tp := make([]any, len(ports))
	for i, p := range ports {
		tp[i] = map[string]any{"number": p}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1",
		"kind":       "InferencePool",
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": map[string]any{"app": "vllm"}},
			"targetPorts":       tp,
			"endpointPickerRef": map[string]any{"name": "warden-epp", "port": map[string]any{"number": int64(9002)}},
		},
	}}
}

func kubePod(name, ip string, ready bool) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "llm", Labels: map[string]string{"app": "vllm"}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
	}
}

func fakeKube(t *testing.T, pools []runtime.Object, pods ...runtime.Object) (kubeClients, *fake.Clientset, *dynfake.FakeDynamicClient) {
	t.Helper()
	cs := fake.NewClientset(pods...)
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{epp.PoolResource: "InferencePoolList"}, pools...)
	return kubeClients{Core: cs, Dynamic: dyn}, cs, dyn
}

const kubeConfigYAML = "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nauth: passthrough\ntimeouts: {drain: 2s}\nmodels:\n  - name: " + kubeModel + "\n"

// TestKubePoolMovesThroughReplicaSet drives warden epp --kubernetes's
// wiring (followPool into the replica set SIGHUP also reloads) with
// client-go's fake clientset and fake dynamic client as the API server:
// pods added, made unready and removed move through the picker's
// replicas (two target ports: two endpoints a pod); the sessions homed on
// the endpoints that stay keep their homes across each change; a pool
// whose targetPorts change is followed, and a SIGHUP reload keeps the
// pool's endpoints.
func TestKubePoolMovesThroughReplicaSet(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	kc, cs, dyn := fakeKube(t, []runtime.Object{kubePool("llm", "qwen", 8000, 8001)},
		kubePod("vllm-0", "10.0.0.1", true), kubePod("vllm-1", "10.0.0.2", true))
	cfg, err := epp.ParsePoolConfig("epp.yaml", []byte(kubeConfigYAML))
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	rs, err := newReplicaSet(cfg, true, nil, live.WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done, err := followPool(ctx, kc, "llm", "qwen", rs, logger)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	bg := context.Background()
	expect := func(want ...string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !slices.Equal(rs.ls.Endpoints(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("the picker has %v, want %v", rs.ls.Endpoints(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	place := func(s string) string {
		t.Helper()
		dec, ref := rs.ls.Decide(live.DecideInput{Path: "/v1/chat/completions", Header: http.Header{"X-Session-Id": {s}},
			Body: fmt.Appendf(nil, `{"model":%q,"messages":[{"role":"user","content":"hello %s"}]}`, kubeModel, s)})
		if ref != nil {
			t.Fatalf("%s: %d %s", s, ref.Status, ref.Body)
		}
		defer dec.Finish()
		return dec.Endpoint()
	}
	expect("10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.2:8000", "10.0.0.2:8001")
	homes := map[string]string{}
	for i := range 16 {
		s := fmt.Sprintf("session-%d", i)
		homes[s] = place(s)
	}
	if n := len(slices.Compact(slices.Sorted(func(yield func(string) bool) {
		for _, h := range homes {
			if !yield(h) {
				return
			}
		}
	}))); n < 4 {
		t.Fatalf("16 sessions on %d endpoints, want all 4 used: %v", n, homes)
	}
	kept := func(gone string) {
		t.Helper()
		for s, h := range homes {
			if strings.HasPrefix(h, gone+":") {
				continue
			}
			if e := place(s); e != h {
				t.Errorf("session %s homed on %s went to %s", s, h, e)
			}
		}
	}

	// A pod added unready changes nothing; once ready, it is added.
	p2 := kubePod("vllm-2", "10.0.0.3", false)
	if _, err := cs.CoreV1().Pods("llm").Create(bg, p2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p2.Status.Conditions[0].Status = corev1.ConditionTrue
	if _, err := cs.CoreV1().Pods("llm").UpdateStatus(bg, p2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.2:8000", "10.0.0.2:8001", "10.0.0.3:8000", "10.0.0.3:8001")
	kept("")

	// vllm-0 made unready: its endpoints leave, the other homes stay.
	if _, err := cs.CoreV1().Pods("llm").UpdateStatus(bg, kubePod("vllm-0", "10.0.0.1", false), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("10.0.0.2:8000", "10.0.0.2:8001", "10.0.0.3:8000", "10.0.0.3:8001")
	kept("10.0.0.1")
	for s, h := range homes { // re-homed sessions: their new home from now on
		if strings.HasPrefix(h, "10.0.0.1:") {
			homes[s] = place(s)
		}
	}

	// The pool gains a third target port (a third DP rank per pod):
	// followed, and every session keeps its home.
	pool, err := dyn.Resource(epp.PoolResource).Namespace("llm").Get(bg, "qwen", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedSlice(pool.Object, []any{map[string]any{"number": int64(8000)}, map[string]any{"number": int64(8001)}, map[string]any{"number": int64(8002)}}, "spec", "targetPorts"); err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(epp.PoolResource).Namespace("llm").Update(bg, pool, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("10.0.0.2:8000", "10.0.0.2:8001", "10.0.0.2:8002", "10.0.0.3:8000", "10.0.0.3:8001", "10.0.0.3:8002")
	kept("")

	// A SIGHUP reload (a new configuration) keeps the pool's endpoints
	// and the homes.
	next, err := epp.ParsePoolConfig("epp.yaml", []byte(kubeConfigYAML+"    spill_threshold: 64\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.setConfig(next); err != nil {
		t.Fatal(err)
	}
	expect("10.0.0.2:8000", "10.0.0.2:8001", "10.0.0.2:8002", "10.0.0.3:8000", "10.0.0.3:8001", "10.0.0.3:8002")
	kept("")

	// vllm-1 deleted: only vllm-2's endpoints remain, its homes kept.
	if err := cs.CoreV1().Pods("llm").Delete(bg, "vllm-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("10.0.0.3:8000", "10.0.0.3:8001", "10.0.0.3:8002")
	kept("10.0.0.2")
}

// TestEPPKubernetesServes runs warden epp --kubernetes whole on the fake
// API server: it answers on gRPC once the pool's pods are its endpoints
// (readiness SERVING, /api/status naming the pods' endpoints), its admin
// address answers its Service's names, and it stops on SIGTERM with no
// goroutine left.
func TestEPPKubernetesServes(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	// TEST-NET-1 (RFC 5737): no server answers the scrapes there.
	kc, _, _ := fakeKube(t, []runtime.Object{kubePool("llm", "qwen", 8000, 8001)}, kubePod("vllm-0", "192.0.2.1", true))
	p := filepath.Join(t.TempDir(), "epp.yaml")
	if err := os.WriteFile(p, []byte(kubeConfigYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("search llm.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := &eppOptions{Config: p, LogLevel: "error", Kubernetes: true, Pool: "qwen", Service: "warden-epp", resolvConf: resolv,
		connect: func(string) (kubeClients, string, error) { return kc, "llm", nil }}
	e := startEPP(t, opts)
	conn := e.conn
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	r, err := healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{Service: "readiness"})
	ccancel()
	conn.Close()
	if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("readiness: %v %v, want SERVING", r.GetStatus(), err)
	}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	// The admin address answers a scrape by the picker's Service DNS
	// (--service: the name, with the namespace, under the pod's search
	// domains) and still refuses other names (issue 50, item 6: 403
	// before, so Prometheus could not scrape warden-epp.llm.svc).
	for host, want := range map[string]int{"warden-epp.llm.svc.cluster.local:9090": 200, "warden-epp:9090": 200,
		"warden-epp.llm.svc": 200, "warden-epp.evil.example": 403, "evil.example": 403} {
		req, _ := http.NewRequest(http.MethodGet, e.admin+"/metrics", nil)
		req.Host = host
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != want {
			t.Errorf("admin with Host %s: %d, want %d", host, res.StatusCode, want)
		}
	}
	res, err := hc.Get(e.admin + "/api/status")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, ep := range []string{"192.0.2.1:8000", "192.0.2.1:8001"} {
		if !strings.Contains(string(body), ep) {
			t.Errorf("/api/status does not name the pool's endpoint %s: %.300s", ep, body)
		}
	}
	e.stop()
}

// TestEPPKubernetesErrors: what stops warden epp --kubernetes at start
// says what is wrong and names the pool and the namespace: no API server
// reachable, the pool not found, RBAC forbidding the pool or its pods, a
// pool with no target ports; flags and configuration mistakes are refused
// before any API call.
func TestEPPKubernetesErrors(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	p := filepath.Join(dir, "epp.yaml")
	if err := os.WriteFile(p, []byte(kubeConfigYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	withReplicas := filepath.Join(dir, "static.yaml")
	if err := os.WriteFile(withReplicas, []byte(kubeConfigYAML+"    replicas: [http://10.0.0.1:8000]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A kubeconfig whose API server does not listen (a port just closed).
	unreachable := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(unreachable, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: llm}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	forbid := func(verb, resource string) func(*dynfake.FakeDynamicClient, *fake.Clientset) {
		return func(dyn *dynfake.FakeDynamicClient, cs *fake.Clientset) {
			react := func(a k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: resource}, "", errors.New(`User "system:serviceaccount:llm:default" cannot `+verb+` resource "`+resource+`"`))
			}
			dyn.PrependReactor(verb, resource, react)
			cs.PrependReactor(verb, resource, react)
		}
	}
	for _, tt := range []struct {
		name   string
		opts   eppOptions
		env    string // $KUBECONFIG, and the real clients
		pools  []runtime.Object
		break_ func(*dynfake.FakeDynamicClient, *fake.Clientset)
		want   []string
	}{
		{name: "unreachable", opts: eppOptions{Kubeconfig: unreachable, Pool: "qwen"},
			want: []string{`InferencePool "qwen" in namespace "llm"`, "no Kubernetes API server reachable", "https://127.0.0.1:1/"}},
		{name: "KUBECONFIG", opts: eppOptions{Pool: "qwen"}, env: unreachable,
			want: []string{`InferencePool "qwen" in namespace "llm"`, "no Kubernetes API server reachable", "https://127.0.0.1:1/"}},
		{name: "no kubeconfig file", opts: eppOptions{Kubeconfig: filepath.Join(dir, "nope"), Pool: "qwen"},
			want: []string{"--kubernetes", "nope"}},
		{name: "not found", opts: eppOptions{Pool: "qwen", Namespace: "llm"},
			want: []string{`InferencePool "qwen" in namespace "llm": not found`, "kubectl -n llm get inferencepools"}},
		{name: "other namespace", opts: eppOptions{Pool: "qwen", Namespace: "prod"}, pools: []runtime.Object{kubePool("llm", "qwen", 8000)},
			want: []string{`InferencePool "qwen" in namespace "prod": not found`}},
		{name: "pool forbidden", opts: eppOptions{Pool: "qwen", Namespace: "llm"}, pools: []runtime.Object{kubePool("llm", "qwen", 8000)}, break_: forbid("get", "inferencepools"),
			want: []string{`InferencePool "qwen" in namespace "llm": reading it is forbidden`, "get, list and watch on inferencepools.inference.networking.k8s.io", "deploy/kubernetes/rbac.yaml"}},
		{name: "pods forbidden", opts: eppOptions{Pool: "qwen", Namespace: "llm"}, pools: []runtime.Object{kubePool("llm", "qwen", 8000)}, break_: forbid("list", "pods"),
			want: []string{`InferencePool "qwen" in namespace "llm": listing its pods (app=vllm) is forbidden`, "get, list and watch on pods"}},
		{name: "no target ports", opts: eppOptions{Pool: "qwen", Namespace: "llm"}, pools: []runtime.Object{kubePool("llm", "qwen")},
			want: []string{`InferencePool "qwen" in namespace "llm": spec.targetPorts is empty`}},
		{name: "no pool flag", opts: eppOptions{}, want: []string{"--kubernetes needs --pool NAME"}},
		{name: "replicas listed", opts: eppOptions{Config: withReplicas, Pool: "qwen"},
			want: []string{"static.yaml:7: models[0].replicas: with --kubernetes the endpoints are the InferencePool's ready pods"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			opts := tt.opts
			opts.Kubernetes, opts.LogLevel = true, "error"
			if opts.Config == "" {
				opts.Config = p
			}
			if tt.env != "" {
				t.Setenv("KUBECONFIG", tt.env)
			} else if opts.Kubeconfig == "" {
				kc, cs, dyn := fakeKube(t, tt.pools, kubePod("vllm-0", "10.0.0.1", true))
				if tt.break_ != nil {
					tt.break_(dyn, cs)
				}
				opts.connect = func(string) (kubeClients, string, error) { return kc, "default", nil }
			}
			err := runEPP(context.Background(), &opts, io.Discard, io.Discard)
			if err == nil {
				t.Fatal("warden epp --kubernetes started")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\nwant it to contain %q", err, w)
				}
			}
		})
	}
	// The Kubernetes flags without --kubernetes are a mistake.
	err := runEPP(context.Background(), &eppOptions{Config: "../../epp/testdata/epp.yaml", Check: true, Pool: "qwen", LogLevel: "info"}, io.Discard, io.Discard)
	if err == nil || err.Error() != "--pool needs --kubernetes" {
		t.Errorf("--pool without --kubernetes: %v", err)
	}
}
