package archtest

import (
	"strings"
	"testing"
)

func TestMatches(t *testing.T) {
	for _, tc := range []struct {
		path, pattern string
		want          bool
	}{
		{Module + "/live", "live", true},
		{Module + "/live/upstream", "live", false},
		{Module + "/live/upstream", "live/...", true},
		{Module + "/live", "live/...", true},
		{Module + "/livex", "live/...", false},
		{Module + "/metrics/names", "metrics", false},
		{"github.com/other/live", "live", false},
	} {
		if got := matches(tc.path, tc.pattern); got != tc.want {
			t.Errorf("matches(%q, %q) = %v, want %v", tc.path, tc.pattern, got, tc.want)
		}
	}
}

// TestViolationsFound: the check can fail. epp imports live, and depends
// on placement through it; rules that forbid either name them.
func TestViolationsFound(t *testing.T) {
	bad, err := Violations("epp", Rules{Never: []string{"placement"}, Std: map[string]string{"net/http": "a test rule"}})
	if err != nil {
		t.Skip(err)
	}
	got := strings.Join(bad, "\n")
	for _, want := range []string{
		"epp imports " + Module + "/live: not among",
		"epp depends on " + Module + "/placement",
		"epp imports net/http: a test rule",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("violations:\n%s\nwant one with %q", got, want)
		}
	}
}

// TestSupportOnlyInTests: no non-test file outside the test-support
// packages imports one of them (internal/fakevllm above all: a fake vLLM
// linked into the proxy), and every package whose non-test files import
// testing is among them.
func TestSupportOnlyInTests(t *testing.T) {
	bad, err := TestOnlyViolations(TestSupport)
	if err != nil {
		t.Skip(err) // no go command: as Check does
	}
	for _, b := range bad {
		t.Error(b)
	}
}

// TestTestOnlyViolationsFound: the check can fail. bench imports
// internal/num in a non-test file; with internal/num taken for test
// support, that is named, as is a listed package that does not exist and
// a real test-support package left off the list.
func TestTestOnlyViolationsFound(t *testing.T) {
	bad, err := TestOnlyViolations([]string{"internal/num", "internal/nosuch"})
	if err != nil {
		t.Skip(err)
	}
	got := strings.Join(bad, "\n")
	for _, want := range []string{
		"bench imports " + Module + "/internal/num, a test-support package, in a non-test file",
		"test-support package internal/nosuch does not exist",
		"internal/fakevllm imports testing in a non-test file: a test-support package not listed",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("violations:\n%s\nwant one with %q", got, want)
		}
	}
}
