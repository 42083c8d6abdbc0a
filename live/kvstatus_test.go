package live

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/lm-warden/warden/internal/fakevllm"
)

// TestStatusKVAndAdmission: with vllm:cache_config_info exposed and
// admission: kv, /api/status shows each replica's KV capacity, resident
// footprint and headroom, and the model's admission queue (waiting now,
// waits and timeouts since start); /metrics has the same as
// warden_kv_headroom_tokens, warden_admission_waiting and
// warden_admission_timeouts_total.
func TestStatusKVAndAdmission(t *testing.T) {
	a := fakevllm.New(t, 1)
	a.GPUBlocks = 60 // 960 tokens: one conversation of the test fits, two do not
	h := startProxy(t, modelsYAML("", admissionModel(a.URL(), "    admission_timeout: 300ms\n")))
	h.scraped()
	if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "first", 0, false), sessionHdr("first")); r.status != 200 {
		t.Fatalf("first conversation: status %d %s", r.status, r.body)
	}
	second := h.doAsync("/v1/chat/completions", chatBody(testModel, "second", 0, true), sessionHdr("second"))
	waitFor(t, "the second conversation to wait", func() bool { return h.waiters(testModel) == 1 })
	st := h.status().Models[0]
	if st.Admission == nil || st.Admission.Waiting != 1 || st.Admission.Waits != 1 || st.Admission.Timeouts != 0 || st.Admission.TimeoutSec != 0.3 {
		t.Errorf("admission while one waits: %+v, want waiting 1, waits 1, timeouts 0, timeout_s 0.3", st.Admission)
	}
	rs := st.Replicas[0]
	if rs.KVCapacityTokens == nil || *rs.KVCapacityTokens != 960 {
		t.Fatalf("kv_capacity_tokens %v, want 960 (60 blocks of 16)", rs.KVCapacityTokens)
	}
	if rs.FootprintTokens <= 0 || rs.HeadroomTokens == nil || *rs.HeadroomTokens != 960-rs.FootprintTokens {
		t.Errorf("footprint %d headroom %v: want a footprint from the first answer's usage and headroom = 960 - footprint", rs.FootprintTokens, rs.HeadroomTokens)
	}
	if rs.Active != 1 {
		t.Errorf("held (active) sessions %d, want 1", rs.Active)
	}
	h.waitMetrics(`warden_admission_waiting{model="qwen"} 1`,
		fmt.Sprintf(`warden_kv_headroom_tokens{model="qwen",replica="0"} %d`, *rs.HeadroomTokens))
	if r := <-second; r.status != 429 {
		t.Fatalf("second conversation: status %d, want 429 after admission_timeout", r.status)
	}
	st = h.status().Models[0]
	if st.Admission == nil || st.Admission.Waiting != 0 || st.Admission.Waits != 1 || st.Admission.Timeouts != 1 {
		t.Errorf("admission after the timeout: %+v, want waiting 0, waits 1, timeouts 1", st.Admission)
	}
	h.waitMetrics(`warden_admission_waiting{model="qwen"} 0`, `warden_admission_timeouts_total{model="qwen"} 1`)
}

// TestStatusWithoutKV: admission off and no cache size exposed: no
// admission block, a null capacity and headroom, no headroom series.
func TestStatusWithoutKV(t *testing.T) {
	a := fakevllm.New(t, 1)
	a.GPUBlocks = -1 // num_gpu_blocks not exposed
	h := startProxy(t, modelsYAML("", urlsModel(a.URL())))
	h.scraped()
	st := h.status().Models[0]
	if st.Admission != nil || st.Replicas[0].KVCapacityTokens != nil || st.Replicas[0].HeadroomTokens != nil {
		t.Errorf("admission %+v capacity %v headroom %v, want none", st.Admission, st.Replicas[0].KVCapacityTokens, st.Replicas[0].HeadroomTokens)
	}
	if m := h.metrics(); strings.Contains(m, "warden_kv_headroom_tokens{") || strings.Contains(m, "warden_admission_waiting{") {
		t.Errorf("/metrics has KV or admission series without them")
	}
}

// TestStatusSpillReasons: a later turn that leaves its overloaded home is
// recorded with the reason, newest first, without the session id.
func TestStatusSpillReasons(t *testing.T) {
	a, b := fakevllm.New(t, 1), fakevllm.New(t, 1)
	a.Hold = make(chan struct{})
	h := startProxy(t, modelsYAML("", urlsModel(a.URL(), b.URL())+"    spill_threshold: 1\n"))
	h.scraped()
	var wg sync.WaitGroup
	for turn := range 2 {
		wg.Go(func() {
			h.do("POST", "/v1/chat/completions", chatBody(testModel, "secret-session", turn, true), sessionHdr("secret-session"))
		})
		h.waitFor("turns at home", func(StatusReport) bool { return sum(a.Served()) == turn+1 })
	}
	if st := h.status().Models[0]; len(st.SpillReasons) != 0 {
		t.Errorf("spill reasons before any spill: %+v", st.SpillReasons)
	}
	if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, "secret-session", 2, false), sessionHdr("secret-session")); r.status != 200 {
		t.Fatalf("spill turn: %d %s", r.status, r.body)
	}
	close(a.Hold)
	wg.Wait()
	st := h.status().Models[0]
	if len(st.SpillReasons) != 1 {
		t.Fatalf("spill reasons %+v, want one", st.SpillReasons)
	}
	if sr := st.SpillReasons[0]; sr.From != 0 || sr.To != 1 || sr.Reason != "home 2 in flight > 1" || sr.Time.IsZero() {
		t.Errorf("spill reason %+v, want from 0 to 1, \"home 2 in flight > 1\"", sr)
	}
	res, err := h.client.Get(h.admin + "/api/status")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if strings.Contains(string(body), "secret-session") {
		t.Errorf("/api/status names the session id")
	}
}

func TestSpillRing(t *testing.T) {
	var r spillRing
	for i := range spillRingSize + 3 {
		r.add(SpillReason{From: i})
	}
	got := r.last()
	if len(got) != spillRingSize || got[0].From != spillRingSize+2 || got[spillRingSize-1].From != 3 {
		t.Errorf("ring %+v, want the last %d, newest first", got, spillRingSize)
	}
}
