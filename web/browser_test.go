package web_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lm-warden/warden/web"
	"github.com/lm-warden/warden/web/webtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// writePage renders r into a file in a fresh directory and returns its file:// URL.
func writePage(t *testing.T, r *web.Report) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "report.html")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Render(f); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return "file://" + path
}

// CheckReport opens a rendered report in headless Chromium with the network blocked and fails
// unless every chart drew a canvas, the page logged nothing, requested nothing, and shows its
// answer sentence. Other packages can copy this check for their own reports.
func checkReport(t *testing.T, r *web.Report) webtest.PageResult {
	t.Helper()
	url := writePage(t, r)
	res := webtest.CheckPage(t, url)
	if want := len(r.Charts()); res.Canvases != want {
		t.Errorf("page drew %d canvases, want one per chart (%d)", res.Canvases, want)
	}
	if len(res.Console) > 0 {
		t.Errorf("console messages: %q", res.Console)
	}
	if len(res.Blocked) > 0 {
		t.Errorf("the page tried to reach the network: %q", res.Blocked)
	}
	if !strings.Contains(res.Text, r.Answer) {
		t.Errorf("page text lacks the answer %q", r.Answer)
	}
	screenshot(t, url)
	return res
}

// screenshot saves a PNG of url into $WARDEN_SCREENSHOTS, when set, for a person to look at.
func screenshot(t *testing.T, url string) {
	t.Helper()
	if dir := os.Getenv("WARDEN_SCREENSHOTS"); dir != "" {
		b := webtest.Find(t)
		b.Width, b.Height = 1400, 4000
		b.Screenshot(t, url, filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+".png"))
	}
}

func TestReportDrawsOfflineInChromium(t *testing.T) {
	r := web.SampleReport()
	if len(r.Charts()) < 4 {
		t.Fatalf("sample report has %d charts, want at least 4 (one per kind)", len(r.Charts()))
	}
	checkReport(t, r)
}

func TestSimReportDrawsOfflineInChromium(t *testing.T) {
	checkReport(t, web.SimReport(web.SampleSimResult(), web.SimReportOptions{}))
}
