package web_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/lm-warden/warden/live"
	"github.com/lm-warden/warden/web"
	"github.com/lm-warden/warden/web/webtest"
)

// sameHostStatus is a proxy's /api/status with replicas that differ only at the end of their
// names: two vLLM servers on one host (one long in-cluster name, two ports) and two
// data-parallel ranks of one URL; the first model's max_num_seqs is assumed, as live says when
// neither the config nor the server states it.
func sameHostStatus() live.StatusReport {
	const host = "http://vllm-qwen3-coder-30b-a3b-0.vllm-headless.inference.svc.cluster.local"
	rep := func(id int, url string, rank *int) live.ReplicaStatus {
		return live.ReplicaStatus{ID: id, URL: url, Rank: rank, State: "healthy", ScrapeState: "ok"}
	}
	zero, one := 0, 1
	return live.StatusReport{Models: []live.Status{
		{
			Model: "qwen3-coder", Layout: "urls", Strategy: "affinity", Affinity: true, SpillThreshold: 64, SpillAuto: true,
			MaxNumSeqs: 256, MaxNumSeqsSource: "default",
			Warnings: []string{"max_num_seqs is not exposed by the server (llm-d-inference-sim and other engines do not) and " +
				"neither max_num_seqs nor gpu is configured: assumed vLLM's default 256, auto spill threshold 64; set " +
				"models[].max_num_seqs (or gpu)"},
			Replicas: []live.ReplicaStatus{rep(0, host+":8000", nil), rep(1, host+":8001", nil)},
		},
		{
			Model: "qwen3-4b", Layout: "data-parallel", Strategy: "affinity", Affinity: true, SpillThreshold: 8, SpillAuto: true,
			MaxNumSeqs: 32, MaxNumSeqsSource: "config",
			Replicas: []live.ReplicaStatus{rep(0, host+":8100", &zero), rep(1, host+":8100", &one)},
		},
	}}
}

// measurePage opens the dashboard in a same-origin iframe of 1400 px and writes, once its
// replica tables are there, each replica cell's text with its scroll and client widths and
// each warning the page shows.
const measurePage = `<!DOCTYPE html><html><body style="margin:0">
<iframe id="f" src="/dashboard/" style="width:1400px;height:900px;border:0"></iframe>
<pre id="measure">pending</pre>
<script>
function check() {
  var d = document.getElementById("f").contentDocument;
  var cells = d ? d.querySelectorAll("table.replicas tbody tr td:first-child") : [];
  if (cells.length < 4) { setTimeout(check, 50); return; }
  var out = [];
  cells.forEach(function (c) { out.push("cell " + c.scrollWidth + " " + c.clientWidth + " " + c.textContent); });
  d.querySelectorAll(".warning").forEach(function (w) {
    var r = w.getBoundingClientRect();
    out.push("warning " + (r.width > 0 && r.height > 0 ? "visible" : "hidden") + " " + w.textContent);
  });
  document.getElementById("measure").textContent = out.join("\n");
}
check();
</script></body></html>`

// TestDashboardReplicasReadApart: the routing page shows the max_num_seqs warning the status
// carries, and names replicas in full, so that two on one host read apart: no replica cell is
// cut (its text fits its box: scrollWidth <= clientWidth, no ellipsis) and no two cells read
// the same.
func TestDashboardReplicasReadApart(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("/dashboard/", web.DashboardHandler(web.DashboardOptions{Prefix: "/dashboard/"}))
	mux.HandleFunc("/api/status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(sameHostStatus())
	})
	mux.HandleFunc("/measure", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, measurePage) })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	screenshot(t, srv.URL+"/dashboard/")

	res := webtest.CheckPage(t, srv.URL+"/measure")
	got := regexp.MustCompile(`(?s)<pre id="measure">(.*?)</pre>`).FindStringSubmatch(res.DOM)
	if got == nil || got[1] == "pending" {
		t.Fatalf("the page never measured its replica cells; DOM:\n%.2000s", res.DOM)
	}
	seen := map[string]bool{}
	var cells, warnings int
	for _, l := range strings.Split(got[1], "\n") {
		kind, rest, _ := strings.Cut(l, " ")
		switch kind {
		case "cell":
			cells++
			var scroll, client int
			if _, err := fmt.Sscanf(rest, "%d %d", &scroll, &client); err != nil {
				t.Fatalf("measure %q: %v", l, err)
			}
			text := strings.SplitN(rest, " ", 3)[2]
			if scroll > client {
				t.Errorf("replica %q is cut: %d px of text in a %d px cell", text, scroll, client)
			}
			if seen[text] {
				t.Errorf("two replicas read %q", text)
			}
			seen[text] = true
		case "warning":
			warnings++
			if !strings.HasPrefix(rest, "visible ") || !strings.Contains(rest, "assumed vLLM's default 256, auto spill threshold 64") {
				t.Errorf("warning %q: want it visible, saying what max_num_seqs is assumed", rest)
			}
		}
	}
	if cells != 4 || warnings != 1 {
		t.Errorf("%d replica cells and %d warnings, want 4 and 1:\n%s", cells, warnings, got[1])
	}
	for _, want := range []string{"0 (rank 0) " + "http://vllm-qwen3-coder-30b-a3b-0", ":8001"} {
		if !strings.Contains(got[1], want) {
			t.Errorf("replica cells lack %q:\n%s", want, got[1])
		}
	}
}
