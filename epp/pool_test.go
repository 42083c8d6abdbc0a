package epp

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
)

// TestParsePoolSpec reads an InferencePool (inference.networking.k8s.io/v1)
// as the API server serves it, and refuses, naming the pool and the
// field, what would make the picker take the wrong pods or ports.
func TestParsePoolSpec(t *testing.T) {
	pool := func(spec map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
			"metadata": map[string]any{"name": "qwen", "namespace": "llm"}, "spec": spec}}
	}
	sel := map[string]any{"matchLabels": map[string]any{"app": "vllm", "model": "qwen3"}}
	ports := func(n ...any) []any {
		var out []any
		for _, p := range n {
			out = append(out, map[string]any{"number": p})
		}
		return out
	}
	for _, tt := range []struct {
		name      string
		spec      map[string]any
		wantSel   string
		wantPorts []int
		wantErr   string
	}{
		{name: "dp ports", spec: map[string]any{"selector": sel, "targetPorts": ports(int64(8000), int64(8001))}, wantSel: "app=vllm,model=qwen3", wantPorts: []int{8000, 8001}},
		{name: "json float", spec: map[string]any{"selector": sel, "targetPorts": ports(float64(8000))}, wantSel: "app=vllm,model=qwen3", wantPorts: []int{8000}},
		{name: "no selector", spec: map[string]any{"targetPorts": ports(int64(8000))}, wantErr: `InferencePool "qwen" in namespace "llm": spec.selector.matchLabels is empty`},
		{name: "empty selector", spec: map[string]any{"selector": map[string]any{"matchLabels": map[string]any{}}, "targetPorts": ports(int64(8000))}, wantErr: "spec.selector.matchLabels is empty"},
		{name: "bad label", spec: map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"app": "a b"}}, "targetPorts": ports(int64(8000))}, wantErr: "spec.selector.matchLabels:"},
		{name: "no ports", spec: map[string]any{"selector": sel}, wantErr: "spec.targetPorts is empty"},
		{name: "port 0", spec: map[string]any{"selector": sel, "targetPorts": ports(int64(8000), int64(0))}, wantErr: "spec.targetPorts[1].number: 0 is not a port"},
		{name: "port too big", spec: map[string]any{"selector": sel, "targetPorts": ports(int64(70000))}, wantErr: "spec.targetPorts[0].number: 70000 is not a port"},
		{name: "port string", spec: map[string]any{"selector": sel, "targetPorts": ports("8000")}, wantErr: "spec.targetPorts[0].number: 8000 is not a port"},
		{name: "port twice", spec: map[string]any{"selector": sel, "targetPorts": ports(int64(8000), int64(8000))}, wantErr: "spec.targetPorts[1].number: 8000 is listed twice"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePoolSpec(pool(tt.spec))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Selector.String() != tt.wantSel || !got.Equal(PoolSpec{Selector: got.Selector, TargetPorts: tt.wantPorts}) {
				t.Errorf("got %s %v, want %s %v", got.Selector, got.TargetPorts, tt.wantSel, tt.wantPorts)
			}
		})
	}
}

// TestParsePoolConfig: a picker fed by a pool lists no endpoints itself;
// one that does is refused at the key's line, and the proxy's own rules
// still apply.
func TestParsePoolConfig(t *testing.T) {
	const head = "listen: 127.0.0.1:0\nauth: passthrough\nmodels:\n  - name: m\n"
	cfg, err := ParsePoolConfig("epp.yaml", []byte(head+"    strategy: affinity\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r := cfg.Models[0].Replicas; len(r) != 0 {
		t.Errorf("replicas %v, want none until the pool gives them", r)
	}
	if got := WithEndpoints(cfg, []string{"10.0.0.1:8000"}).Models[0].Replicas; len(got) != 1 || got[0] != "http://10.0.0.1:8000" {
		t.Errorf("WithEndpoints: %v", got)
	}
	for _, tt := range []struct{ name, model, want string }{
		{"replicas", "    replicas: [http://10.0.0.1:8000]\n", "epp.yaml:5: models[0].replicas: with --kubernetes the endpoints are the InferencePool's ready pods"},
		{"url", "    url: http://10.0.0.1:8000\n    data_parallel_size: 2\n", "epp.yaml:5: models[0].url: with --kubernetes"},
		{"proxy rule", "    strategy: random\n", "epp.yaml:5: models[0].strategy"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParsePoolConfig("epp.yaml", []byte(head+tt.model))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestPoolRunKeepsLastOnBadChange: Pool.Run follows a changed pool, keeps
// the last spec it could read when the pool changes to one it cannot (a
// selector emptied: every pod of the namespace) and keeps following the
// pods of the last spec when the pool is deleted. TestMain checks that no
// goroutine outlives Run.
func TestPoolRunKeepsLastOnBadChange(t *testing.T) {
	ctx := context.Background()
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": "qwen", "namespace": "llm"},
		"spec": map[string]any{
			"selector":    map[string]any{"matchLabels": map[string]any{"app": "vllm"}},
			"targetPorts": []any{map[string]any{"number": int64(8000)}},
		}}}
	cs := fake.NewClientset(pod("vllm-0", "10.0.0.1", true))
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{PoolResource: "InferencePoolList"}, pool)
	got := make(chan []string, 16)
	p := &Pool{Core: cs, Dynamic: dyn, Namespace: "llm", Name: "qwen", Log: slog.New(slog.DiscardHandler),
		Apply: func(eps []string) error { got <- eps; return nil }}
	spec, err := p.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(rctx, spec, nil) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	expect := func(want ...string) { t.Helper(); awaitEndpoints(t, got, want) }
	setPorts := func(ports ...int64) {
		t.Helper()
		u, err := dyn.Resource(PoolResource).Namespace("llm").Get(ctx, "qwen", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var tp []any
		for _, n := range ports {
			tp = append(tp, map[string]any{"number": n})
		}
		if err := unstructured.SetNestedSlice(u.Object, tp, "spec", "targetPorts"); err != nil {
			t.Fatal(err)
		}
		if _, err := dyn.Resource(PoolResource).Namespace("llm").Update(ctx, u, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	expect("10.0.0.1:8000")
	setPorts(8000, 8001)
	expect("10.0.0.1:8000", "10.0.0.1:8001")
	// No target ports: unreadable, the last spec stays; the next pod
	// still gets both ports.
	setPorts()
	if _, err := cs.CoreV1().Pods("llm").Create(ctx, pod("vllm-1", "10.0.0.2", true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.2:8000", "10.0.0.2:8001")
	// Deleted: the pods of the last spec are still followed.
	if err := dyn.Resource(PoolResource).Namespace("llm").Delete(ctx, "qwen", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cs.CoreV1().Pods("llm").Delete(ctx, "vllm-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("10.0.0.2:8000", "10.0.0.2:8001")
}

// awaitEndpoints waits up to 10 s for the endpoint list want on got,
// passing over the lists before it.
func awaitEndpoints(t *testing.T, got <-chan []string, want []string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case eps := <-got:
			if slices.Equal(eps, want) {
				return
			}
		case <-deadline:
			t.Fatalf("endpoints never became %v", want)
		}
	}
}
