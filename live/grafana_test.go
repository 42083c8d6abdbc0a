package live

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"

	"github.com/lm-warden/warden/internal/fakevllm"
)

// TestGrafanaDashboard checks that every query of grafana/warden.json is
// valid PromQL and that every warden_* series it reads is one the proxy
// exports.
func TestGrafanaDashboard(t *testing.T) {
	data, err := os.ReadFile("grafana/warden.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	a := fakevllm.New(t, 1)
	h := startProxy(t, modelsYAML("", urlsModel(a.URL())))
	h.do("POST", "/v1/chat/completions", chatBody(testModel, "g", 0, true), sessionHdr("g"))
	h.waitMetrics(`warden_ttfb_seconds_count{model="qwen"} 1`)
	exported := h.metrics()
	p := parser.NewParser(parser.Options{})
	names := regexp.MustCompile(`warden_[a-z_]+`)
	vars := strings.NewReplacer("$__rate_interval", "1m", "$__range", "1h", "$model", "qwen")
	var seen []string
	for _, panel := range dash.Panels {
		if len(panel.Targets) == 0 {
			t.Errorf("panel %q has no query", panel.Title)
		}
		for _, tg := range panel.Targets {
			if _, err := p.ParseExpr(vars.Replace(tg.Expr)); err != nil {
				t.Errorf("panel %q: %s: %v", panel.Title, tg.Expr, err)
			}
			for _, n := range names.FindAllString(tg.Expr, -1) {
				n = strings.TrimSuffix(n, "_bucket")
				if !slices.Contains(seen, n) {
					seen = append(seen, n)
				}
			}
		}
	}
	for _, n := range seen {
		if !strings.Contains(exported, "# TYPE "+n+" ") {
			t.Errorf("the dashboard reads %s, which /metrics does not export", n)
		}
	}
}
