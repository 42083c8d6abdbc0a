// Package webtest opens pages in real headless Chromium (Debian's package `chromium`) for tests:
// it reports how many canvases the page drew, every console message, every request that tried
// to leave the machine, and the page's text; it can also save a PNG screenshot.
//
// It needs no Go dependency and no DevTools client: Chromium runs with --dump-dom under a virtual
// time budget (timers and fetches run, then the DOM after scripts is printed), console messages
// come from Chromium's own log on stderr, and every non-loopback request is sent to a proxy on
// 127.0.0.1 that records it and answers 403. The page under test is the page as shipped: nothing
// is injected into it.
//
// Start with CheckPage(t, url); use Find for a Browser with other settings.
package webtest

import (
	"bytes"
	"context"
	"fmt"
	"html"
	"net"
	"net/http"
	"net/http/httptest"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Browser is one headless Chromium installation and the settings it is run with.
type Browser struct {
	Path string // the chromium binary

	// VirtualTime is how much page time (timers, intervals, fetches) runs before the DOM is
	// read; virtual time runs faster than the wall clock when the page is idle. 0 means 5s.
	VirtualTime time.Duration
	// Width and Height of the window in CSS pixels; 0 means 1200x900.
	Width, Height int
	// Deadline bounds one Chromium run in wall time, so a hung browser fails the test instead
	// of hanging it; 0 means 90s. It is a safety net, not a timed assertion.
	Deadline time.Duration
}

// PageResult is what Chromium saw after running the page.
type PageResult struct {
	Canvases int      // <canvas> elements in the DOM: echarts draws one per chart
	Console  []string // every console message and uncaught exception, any level, in order
	Blocked  []string // requests that tried to leave the machine (all refused), e.g. "GET http://cdn/x.js"
	// Background lists refused requests of Chromium itself (its updater and sign-in services,
	// BrowserHosts) that a fresh profile makes whatever the page; kept apart from Blocked.
	Background []string
	DOM        string // the serialised DOM after scripts ran
	Text       string // the DOM's text without scripts and styles, whitespace collapsed
}

// Candidates are the paths where Find looks for Chromium, in order.
var Candidates = []string{"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"}

// InstallHint is the command that installs the browser Find looks for.
const InstallHint = "sudo apt-get install -y chromium"

// Find returns the installed Chromium. Without one, the test is skipped with the install
// command, or fails when the CI environment variable is "true" (CI installs it).
func Find(t testing.TB) *Browser {
	t.Helper()
	for _, p := range Candidates {
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return &Browser{Path: p}
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("headless Chromium not found at %v; install with: %s", Candidates, InstallHint)
	}
	t.Skipf("headless Chromium not found at %v; install with: %s", Candidates, InstallHint)
	return nil
}

// CheckPage opens url (http://, https:// or file://) in the installed headless Chromium with
// all network requests beyond loopback blocked, and returns what it saw.
func CheckPage(t testing.TB, url string) PageResult {
	t.Helper()
	return Find(t).Check(t, url)
}

// Check opens url and returns what the page drew, logged and requested.
func (b *Browser) Check(t testing.TB, url string) PageResult {
	t.Helper()
	stdout, stderr, refused := b.run(t, url, "--dump-dom")
	dom := string(stdout)
	r := PageResult{
		Canvases: strings.Count(dom, "<canvas"),
		Console:  ConsoleMessages(stderr),
		DOM:      dom,
		Text:     Text(dom),
	}
	for _, req := range refused {
		if isBrowserRequest(req) {
			r.Background = append(r.Background, req)
		} else {
			r.Blocked = append(r.Blocked, req)
		}
	}
	return r
}

// BrowserHosts are the hosts Chromium itself calls from a fresh profile (component updater,
// sign-in, network time) even with background networking disabled. Requests to them are
// refused like any other but reported in PageResult.Background. Debian's Chromium 148 also
// opens CONNECT www.google.com:443 at start, whatever the page (seen five times for an empty
// page), and now and then android.clients.google.com:443 (its GCM channel).
var BrowserHosts = []string{"update.googleapis.com", "accounts.google.com", "clients2.google.com", "www.google.com", "android.clients.google.com"}

// isBrowserRequest reports whether a refused request ("METHOD target") went to one of
// BrowserHosts.
func isBrowserRequest(req string) bool {
	_, target, _ := strings.Cut(req, " ")
	host := target
	if u, err := neturl.Parse(target); err == nil && u.Host != "" {
		host = u.Host
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return slices.Contains(BrowserHosts, host)
}

// Screenshot opens url and writes a PNG of the window (Width x Height) to pngPath, so a person
// can look at a page; use a tall Height for a whole report.
func (b *Browser) Screenshot(t testing.TB, url, pngPath string) {
	t.Helper()
	abs, err := filepath.Abs(pngPath)
	if err != nil {
		t.Fatal(err)
	}
	b.run(t, url, "--screenshot="+abs, "--hide-scrollbars")
	if st, err := os.Stat(abs); err != nil || st.Size() == 0 {
		t.Fatalf("chromium wrote no screenshot of %s to %s: %v", url, abs, err)
	}
}

// run starts Chromium on url behind a refusing proxy and returns its stdout, its stderr and the
// requests the proxy refused.
func (b *Browser) run(t testing.TB, url string, mode ...string) (stdout, stderr []byte, blocked []string) {
	t.Helper()
	var (
		mu   sync.Mutex
		reqs []string
	)
	// Chromium sends every request except loopback through this proxy; it refuses them all.
	// CONNECT (https) reaches the handler like any other method.
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		reqs = append(reqs, r.Method+" "+requestTarget(r))
		mu.Unlock()
		http.Error(w, "webtest: network blocked", http.StatusForbidden)
	}))
	defer proxy.Close()

	vt, w, h, deadline := b.VirtualTime, b.Width, b.Height, b.Deadline
	if vt <= 0 {
		vt = 5 * time.Second
	}
	if w <= 0 {
		w = 1200
	}
	if h <= 0 {
		h = 900
	}
	if deadline <= 0 {
		deadline = 90 * time.Second
	}
	args := []string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
		"--no-first-run", "--no-default-browser-check",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-extensions", "--disable-default-apps", "--mute-audio",
		"--disable-client-side-phishing-detection", "--disable-domain-reliability", "--no-pings",
		"--disable-features=OptimizationHints,MediaRouter,Translate,AutofillServerCommunication,CertificateTransparencyComponentUpdater,NetworkTimeServiceQuerying",
		"--metrics-recording-only", "--safebrowsing-disable-auto-update", "--password-store=basic",
		"--user-data-dir=" + t.TempDir(),
		"--proxy-server=" + proxy.URL,
		"--enable-logging=stderr", "--v=0",
		fmt.Sprintf("--virtual-time-budget=%d", vt.Milliseconds()),
		fmt.Sprintf("--window-size=%d,%d", w, h),
	}
	args = append(args, mode...)
	args = append(args, url)

	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.Path, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %s: %v\nstderr (tail):\n%s", url, err, tail(errb.String(), 3000))
	}
	proxy.Close() // waits for in-flight handlers
	mu.Lock()
	defer mu.Unlock()
	return out.Bytes(), errb.Bytes(), append([]string(nil), reqs...)
}

func requestTarget(r *http.Request) string {
	if r.Method == http.MethodConnect {
		return r.Host
	}
	return r.URL.String()
}

// consoleLine matches Chromium's log line for a console message or an uncaught exception:
//
//	[pid:tid:date/time.us:INFO:CONSOLE:12] "message", source: file:///x.html (12)
//
// older builds write "INFO:CONSOLE(12)]". The level of the console call is not in the line, so
// callers treat every message as a finding; a shipped page logs nothing.
var consoleLine = regexp.MustCompile(`:CONSOLE[:(]\d*\)?\] (.*)$`)

// ConsoleMessages extracts console messages from Chromium's stderr log.
func ConsoleMessages(stderr []byte) []string {
	var msgs []string
	for line := range strings.Lines(string(stderr)) {
		if m := consoleLine.FindStringSubmatch(strings.TrimRight(line, "\r\n")); m != nil {
			msgs = append(msgs, m[1])
		}
	}
	return msgs
}

var (
	scriptOrStyle = regexp.MustCompile(`(?is)<(script|style)\b.*?</(script|style)\s*>`)
	anyTag        = regexp.MustCompile(`(?s)<[^>]*>`)
	spaces        = regexp.MustCompile(`\s+`)
)

// Text returns the visible text of a serialised DOM: scripts and styles dropped, tags replaced
// by spaces, entities decoded, whitespace collapsed to single spaces.
func Text(dom string) string {
	s := scriptOrStyle.ReplaceAllString(dom, " ")
	s = anyTag.ReplaceAllString(s, " ")
	s = html.UnescapeString(s)
	return strings.TrimSpace(spaces.ReplaceAllString(s, " "))
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
