package web_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/lm-warden/warden/kvevents"
	"github.com/lm-warden/warden/live"
	"github.com/lm-warden/warden/web"
	"github.com/lm-warden/warden/web/webtest"
)

// TestDashboardKVEvents: a status with KV events and re-homes shows, per
// replica, the blocks its cache holds ("≥" for a lower bound, "(off)"
// while disconnected), the computed tokens by why, and the conversations
// re-homed from it; a status without them shows none of these columns.
func TestDashboardKVEvents(t *testing.T) {
	withKV := fakeStatus(1)
	reps := withKV.Models[0].Replicas
	reps[0].KVEvents = &kvevents.ReplicaStatus{Connected: true, Complete: true, BlocksHeld: 61_230,
		Miss: kvevents.MissTokens{Cold: 1_200_000, Evicted: 48_000, Elsewhere: 9_600}}
	reps[1].KVEvents = &kvevents.ReplicaStatus{Connected: false, Complete: false, BlocksHeld: 880, Error: "connection refused"}
	reps[0].Rehomes, reps[1].Rehomes = 3, 0
	mux := http.NewServeMux()
	mux.Handle("/dashboard/", web.DashboardHandler(web.DashboardOptions{Prefix: "/dashboard/"}))
	status := withKV
	mux.HandleFunc("/api/status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(status)
	})
	mux.HandleFunc("/api/history", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(live.HistoryReport{})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	res := webtest.CheckPage(t, srv.URL+"/dashboard/")
	screenshot(t, srv.URL+"/dashboard/")
	if len(res.Console) > 0 {
		t.Errorf("console %q", res.Console)
	}
	for _, want := range []string{
		`<th>cache holds<br>blocks</th><th>computed tok<br>cold/evicted/<br>elsewhere</th><th>re-homed</th>`,
		"<td data-field=\"kv_events\">61.2k</td><td class=\"split\" data-field=\"kv_miss\">1.2M/\u200b48.0k/\u200b9.6k</td><td data-field=\"rehomes\">3</td>",
		"<td data-field=\"kv_events\">≥880 (off)</td><td class=\"split\" data-field=\"kv_miss\">0/\u200b0/\u200b0</td><td data-field=\"rehomes\">0</td>",
	} {
		if !strings.Contains(res.DOM, want) {
			t.Errorf("dashboard DOM lacks\n%s\nDOM:\n%s", want, res.DOM)
		}
	}

	status = fakeStatus(1)
	for i := range status.Models[0].Replicas {
		status.Models[0].Replicas[i].Rehomes = 0
	}
	res = webtest.CheckPage(t, srv.URL+"/dashboard/")
	if strings.Contains(res.DOM, "<th>cache holds") {
		t.Errorf("a status without kv_events shows the KV events column:\n%s", res.DOM)
	}
}
