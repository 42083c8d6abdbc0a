package webtest

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func fileURL(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return "file://" + p
}

func TestCheckOfflinePage(t *testing.T) {
	r := CheckPage(t, fileURL(t, "offline.html"))
	if r.Canvases != 1 {
		t.Errorf("Canvases = %d, want 1", r.Canvases)
	}
	if len(r.Console) != 0 || len(r.Blocked) != 0 {
		t.Errorf("Console = %q, Blocked = %q, want none", r.Console, r.Blocked)
	}
	// The timer fired within the virtual time budget: the DOM is read after scripts ran.
	if !strings.Contains(r.Text, "drawn after 2 s & done") {
		t.Errorf("Text = %q, want the text the timer wrote", r.Text)
	}
}

// A page that needs the network draws nothing; the harness must see every symptom.
func TestCheckPageThatNeedsTheNetwork(t *testing.T) {
	r := CheckPage(t, fileURL(t, "online.html"))
	if r.Canvases != 0 {
		t.Errorf("Canvases = %d, want 0 (echarts never loaded)", r.Canvases)
	}
	for _, want := range []string{"a warning", "Uncaught ReferenceError: echarts is not defined"} {
		if !slices.ContainsFunc(r.Console, func(m string) bool { return strings.Contains(m, want) }) {
			t.Errorf("Console = %q, want a message containing %q", r.Console, want)
		}
	}
	for _, want := range []string{"cdn.example.com", "images.example.org"} {
		if !slices.ContainsFunc(r.Blocked, func(m string) bool { return strings.Contains(m, want) }) {
			t.Errorf("Blocked = %q, want a request to %s", r.Blocked, want)
		}
	}
}

func TestScreenshot(t *testing.T) {
	b := Find(t)
	b.Width, b.Height = 400, 300
	png := filepath.Join(t.TempDir(), "shot.png")
	b.Screenshot(t, fileURL(t, "offline.html"), png)
}

func TestIsBrowserRequest(t *testing.T) {
	tests := []struct {
		req  string
		want bool
	}{
		{"CONNECT update.googleapis.com:443", true},
		{"POST http://update.googleapis.com/service/update2/json?x=1", true},
		{"CONNECT accounts.google.com:443", true},
		{"GET http://cdn.example.com/echarts.min.js", false},
		{"CONNECT fonts.googleapis.com:443", false},
		{"GET http://update.googleapis.com.evil.example/x", false},
	}
	for _, tt := range tests {
		if got := isBrowserRequest(tt.req); got != tt.want {
			t.Errorf("isBrowserRequest(%q) = %v, want %v", tt.req, got, tt.want)
		}
	}
}

func TestConsoleMessages(t *testing.T) {
	tests := []struct {
		name, log string
		want      []string
	}{
		{"none", "[1:1:1129/232116.4:ERROR:dbus/bus.cc:405] Failed to connect to the bus\n", nil},
		{"new format", `[10353:10353:1129/232116.997673:INFO:CONSOLE:4] "boom here", source: file:///tmp/t.html (4)` + "\n",
			[]string{`"boom here", source: file:///tmp/t.html (4)`}},
		{"old format", `[1:1:0101/000000.1:INFO:CONSOLE(12)] "Uncaught x", source: http://127.0.0.1/ (12)` + "\r\n",
			[]string{`"Uncaught x", source: http://127.0.0.1/ (12)`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, ConsoleMessages([]byte(tt.log))); diff != "" {
				t.Errorf("ConsoleMessages (-want +got):\n%s", diff)
			}
		})
	}
}

func TestText(t *testing.T) {
	dom := "<html><head><style>p{}</style><script>var a = '<b>x</b>';</script></head>" +
		"<body><h1>A &amp; B</h1>\n<p>one\n two</p><td>3</td></body></html>"
	if got, want := Text(dom), "A & B one two 3"; got != want {
		t.Errorf("Text = %q, want %q", got, want)
	}
}
