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
