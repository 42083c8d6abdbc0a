package live

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestWithAdminHandler checks the hook cmd/warden mounts the dashboard with:
// an extra handler at "/" of the admin mux serves what the built-in routes
// do not, and never shadows /metrics, /api/status or /healthz.
func TestWithAdminHandler(t *testing.T) {
	cfg, err := ParseConfig("test.yaml", []byte("listen: 127.0.0.1:0\n"+modelsYAML("", urlsModel("http://127.0.0.1:9"))))
	if err != nil {
		t.Fatal(err)
	}
	dash := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "dashboard "+r.URL.Path) })
	srv, err := NewServer(cfg, WithAdminHandler("/", dash))
	if err != nil {
		t.Fatal(err)
	}
	admin := srv.Admin()
	for _, tc := range []struct{ method, path, want string }{
		{"GET", "/", "dashboard /"},
		{"GET", "/stats", "dashboard /stats"},
		{"GET", "/metrics", "warden_requests_total"},
		{"GET", "/api/status", `"models":[{"model":"qwen"`},
		{"GET", "/healthz", "ok"},
	} {
		rec := httptest.NewRecorder()
		admin.ServeHTTP(rec, httptest.NewRequest(tc.method, "http://localhost"+tc.path, nil))
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), tc.want) {
			t.Errorf("%s %s: %d %.80q, want 200 containing %q", tc.method, tc.path, rec.Code, rec.Body.String(), tc.want)
		}
	}
	// Without the option the admin mux has no root.
	plain, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	plain.Admin().ServeHTTP(rec, httptest.NewRequest("GET", "http://localhost/", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("GET / without WithAdminHandler: %d, want 404", rec.Code)
	}
}
