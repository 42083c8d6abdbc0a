package epp

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/lm-warden/warden/live"
)

func pod(name, ip string, ready bool) *corev1.Pod {
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

// TestDiscoveryMovesPods: with client-go's fake clientset as the API
// server, pods of the pool added, made unready and removed move through
// the picker's replica set (two target ports: two endpoints a pod), a pod
// of another app is never taken, and the sessions homed on the pods that
// remain keep their homes across each change.
func TestDiscoveryMovesPods(t *testing.T) {
	cs := fake.NewClientset(pod("vllm-0", "10.0.0.1", true), pod("vllm-1", "10.0.0.2", true))
	other := pod("other", "10.0.0.9", true)
	other.Labels = map[string]string{"app": "other"}
	if _, err := cs.CoreV1().Pods("llm").Create(context.Background(), other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	base, err := live.ParseConfig("epp.yaml", []byte("listen: 127.0.0.1:0\nauth: passthrough\nmodels:\n  - name: "+testModel+"\n    replicas: [http://127.0.0.1:1]\n"))
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu  sync.Mutex
		ls  *live.Server
		got = make(chan []string, 16)
	)
	d := &Discovery{Client: cs, Namespace: "llm", Selector: labels.SelectorFromSet(labels.Set{"app": "vllm"}), TargetPorts: []int{8000, 8001},
		Log: slog.New(slog.DiscardHandler),
		Apply: func(eps []string) error {
			mu.Lock()
			defer mu.Unlock()
			cfg := WithEndpoints(base, eps)
			if ls == nil {
				var err error
				ls, err = live.NewServer(cfg, live.WithLogger(slog.New(slog.DiscardHandler)))
				if err != nil {
					return err
				}
			} else if err := ls.Reload(cfg); err != nil {
				return err
			}
			got <- eps
			return nil
		}}
	ctx, cancel := context.WithCancel(context.Background())
	synced := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx, synced) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	expect := func(want ...string) {
		t.Helper()
		awaitEndpoints(t, got, want)
		mu.Lock()
		defer mu.Unlock()
		if have := ls.Endpoints(); !slices.Equal(have, want) {
			t.Fatalf("the picker has %v, want %v", have, want)
		}
	}
	<-synced
	expect("10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.2:8000", "10.0.0.2:8001")
	// Sessions homed everywhere.
	homes := map[string]string{}
	place := func(s string) string {
		mu.Lock()
		defer mu.Unlock()
		dec, ref := ls.Decide(live.DecideInput{Path: "/v1/chat/completions", Header: http.Header{"X-Session-Id": {s}},
			Body: chatBody(s, 0, 200, false)})
		if ref != nil {
			t.Fatalf("%s: %d %s", s, ref.Status, ref.Body)
		}
		defer dec.Finish()
		return dec.Endpoint()
	}
	for i := range 12 {
		s := fmt.Sprintf("s%d", i)
		homes[s] = place(s)
	}
	check := func(gone string) {
		t.Helper()
		for s, h := range homes {
			if h[:len("10.0.0.x")] == gone {
				continue
			}
			if e := place(s); e != h {
				t.Errorf("session %s homed on %s went to %s after the change", s, h, e)
			}
		}
	}
	// A third pod, not ready yet: nothing changes; ready: added, homes kept.
	p3 := pod("vllm-2", "10.0.0.3", false)
	if _, err := cs.CoreV1().Pods("llm").Create(context.Background(), p3, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p3.Status.Conditions[0].Status = corev1.ConditionTrue
	if _, err := cs.CoreV1().Pods("llm").UpdateStatus(context.Background(), p3, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.2:8000", "10.0.0.2:8001", "10.0.0.3:8000", "10.0.0.3:8001")
	check("")
	// vllm-0 made unready: its endpoints leave, the others keep their sessions.
	p0 := pod("vllm-0", "10.0.0.1", false)
	if _, err := cs.CoreV1().Pods("llm").UpdateStatus(context.Background(), p0, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("10.0.0.2:8000", "10.0.0.2:8001", "10.0.0.3:8000", "10.0.0.3:8001")
	check("10.0.0.1")
	// vllm-1 deleted.
	if err := cs.CoreV1().Pods("llm").Delete(context.Background(), "vllm-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("10.0.0.3:8000", "10.0.0.3:8001")
}
