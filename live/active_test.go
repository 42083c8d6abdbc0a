package live

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/internal/fakevllm"
	"github.com/lm-warden/warden/placement"
)

// Conversations held are active ones: new conversations are balanced by
// the conversations a replica is serving now, not by every home the table
// keeps for the session TTL (issue 11).

// TestFinishedSessionsDoNotPushNewOnes runs the proxy with two replicas:
// three conversations homed on replica 0 finish, one on replica 1 is still
// working. Replica 0 holds more homes (3 > 1) but fewer active
// conversations (0 < 1), so a new conversation goes to replica 0. Before
// active_window, the finished ones counted for their whole TTL and pushed
// it to replica 1.
func TestFinishedSessionsDoNotPushNewOnes(t *testing.T) {
	const window = 500 * time.Millisecond
	a, b := fakevllm.New(t, 1), fakevllm.New(t, 1)
	h := startProxy(t, modelsYAML("trusted_pin_header: X-Warden-Replica\n",
		urlsModel(a.URL(), b.URL())+"    session_ttl: 1h\n    active_window: 500ms\n"))
	h.scraped()
	send := func(session, pin string) {
		t.Helper()
		hdr := sessionHdr(session)
		if pin != "" {
			hdr["X-Warden-Replica"] = pin
		}
		if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, session, 0, false), hdr); r.status != 200 {
			t.Fatalf("%s: %d %s", session, r.status, r.body)
		}
	}
	for _, s := range []string{"done-1", "done-2", "done-3"} {
		send(s, "0") // homed on replica 0 by the pin, then finished
	}
	time.Sleep(window + 300*time.Millisecond) // they go quiet; their homes stay
	send("working", "1")                      // active on replica 1
	st := h.status().Models[0]
	if st.Replicas[0].Sessions != 3 || st.Replicas[0].Active != 0 || st.Replicas[1].Sessions != 1 || st.Replicas[1].Active != 1 {
		t.Fatalf("replica 0 holds %d (%d active), replica 1 %d (%d active); want 3 (0) and 1 (1)",
			st.Replicas[0].Sessions, st.Replicas[0].Active, st.Replicas[1].Sessions, st.Replicas[1].Active)
	}
	if st.Sessions != 4 || st.ActiveSessions != 1 || st.ActiveWindowSec != window.Seconds() {
		t.Errorf("model: %d sessions, %d active, window %vs; want 4, 1, %v", st.Sessions, st.ActiveSessions, st.ActiveWindowSec, window.Seconds())
	}
	before := []int{sum(a.Served()), sum(b.Served())}
	send("newcomer", "")
	after := []int{sum(a.Served()), sum(b.Served())}
	if after[0]-before[0] != 1 {
		t.Fatalf("per replica %v -> %v: the new conversation went to replica 1, want replica 0 (its conversations all finished)", before, after)
	}
	// A finished conversation still goes home within the TTL.
	send("done-2", "")
	if got := sum(a.Served()); got != after[0]+1 {
		t.Errorf("done-2 did not return home to replica 0 (%d requests there, want %d)", got, after[0]+1)
	}
	h.waitMetrics(`warden_active_sessions{model="qwen",replica="0"} 2`, `warden_sessions{model="qwen",replica="0"} 4`)
}

// TestModelPicksByActiveSessions is the same story on the model with the
// clock as an argument, for the affinity policy and for the observer table
// that least-loaded keeps for the status page.
func TestModelPicksByActiveSessions(t *testing.T) {
	for _, strategy := range []string{"affinity", "least-loaded"} {
		t.Run(strategy, func(t *testing.T) {
			cfg := ModelCfg{Name: "m", Strategy: strategy, SpillThreshold: Spill{Auto: true},
				SessionTTL: Duration(time.Hour), ActiveWindow: Duration(2 * time.Minute), MaxSessions: 100,
				Replicas: []string{"http://127.0.0.1:9", "http://127.0.0.1:9"}}
			m, err := newModel(cfg, http.DefaultClient, time.Second, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			t0 := time.Unix(1000, 0)
			for _, rep := range m.replicas {
				rep.server.last.Store(&ScrapeResult{Seq: 1, OK: t0, Healthy: true, Engines: []EngineStats{{}}})
			}
			pick := func(session string, pin int, now time.Time) int {
				t.Helper()
				r := placement.Request{Session: session, Pinned: pin}
				p, err := m.pick(&r, -1, now)
				if err != nil {
					t.Fatal(err)
				}
				p.rep.inFlight.Add(-1)
				return p.Replica
			}
			for _, s := range []string{"d1", "d2", "d3"} {
				pick(s, 0, t0)
			}
			later := t0.Add(2*time.Minute + time.Second)
			pick("w", 1, later)
			m.mu.Lock()
			m.table.Advance(later)
			c := m.table.Counters()
			m.mu.Unlock()
			if c[0].Sessions != 3 || c[0].Active != 0 || c[1].Sessions != 1 || c[1].Active != 1 {
				t.Fatalf("counters %+v, want replica 0: 3 held, 0 active; replica 1: 1 held, 1 active", c)
			}
			if strategy == "affinity" {
				if got := pick("n", placement.NoPin, later); got != 0 {
					t.Errorf("new conversation on replica %d, want 0 (fewer active conversations)", got)
				}
				if got := pick("d1", placement.NoPin, later); got != 0 {
					t.Errorf("d1 went to replica %d, want home 0 within the TTL", got)
				}
			}
		})
	}
}

func TestActiveWindowConfig(t *testing.T) {
	base := "listen: :1\nauth: passthrough\nmodels:\n  - name: m\n    replicas: [http://a:1]\n"
	cfg, err := ParseConfig("t.yaml", []byte(base))
	if err != nil {
		t.Fatal(err)
	}
	// Unset stays unset: the table learns it, from DefaultActiveWindow
	// (or session_ttl, when shorter) up (TestActiveWindowLearnedWhenUnset).
	if got := cfg.Models[0].ActiveWindow.D(); got != 0 {
		t.Errorf("default active_window %v, want 0 (learned)", got)
	}
	if w := placement.NewTableWindow(time.Minute, 0, cfg.Models[0].ActiveWindow.D()).ActiveWindow(); w != time.Minute {
		t.Errorf("learned active_window under session_ttl 1m starts at %v, want 1m", w)
	}
	cfg, err = ParseConfig("t.yaml", []byte(base+"    active_window: 45s\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Models[0].ActiveWindow.D(); got != 45*time.Second {
		t.Errorf("active_window %v, want 45s", got)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"    active_window: -1m\n", `t.yaml:6: models[0].active_window: want a duration such as 1s or 30m, got "-1m"`},
		{"    active_window: soon\n", `t.yaml:6: models[0].active_window: want a duration such as 1s or 30m, got "soon"`},
		{"    session_ttl: 10m\n    active_window: 1h\n", `t.yaml:7: models[0].active_window: 1h0m0s is longer than session_ttl 10m0s`},
	} {
		_, err := ParseConfig("t.yaml", []byte(base+tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want it to contain %q", tc.yaml, err, tc.want)
		}
	}
}

// TestActiveWindowLearnedWhenUnset: a model without active_window learns
// it from the gaps between its conversations' requests, as the simulator
// does for a farm that leaves routing.active_window unset (issue 47: paused
// agent sessions kept counting on their home in the simulator while the
// proxy fixed 2 minutes); one that sets it keeps it fixed.
func TestActiveWindowLearnedWhenUnset(t *testing.T) {
	a, b := fakevllm.New(t, 1), fakevllm.New(t, 1)
	tests := []struct {
		name    string
		keys    string
		learned bool
		window  time.Duration
	}{
		{"unset", "", true, placement.DefaultActiveWindow},
		{"set", "    active_window: 5m\n", false, 5 * time.Minute},
		{"set below the floor", "    active_window: 30s\n", false, 30 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := startProxy(t, modelsYAML("", urlsModel(a.URL(), b.URL())+tt.keys))
			st := h.status().Models[0]
			if st.ActiveWindowLearned != tt.learned || st.ActiveWindowSec != tt.window.Seconds() {
				t.Errorf("active window %vs, learned %v; want %vs, %v", st.ActiveWindowSec, st.ActiveWindowLearned, tt.window.Seconds(), tt.learned)
			}
		})
	}
}
