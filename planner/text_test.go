package planner

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestWrapCommand: a long command is broken at spaces outside quotes, each
// line within the width and ending in a backslash but the last, so that it
// pastes into a shell as the command it was.
func TestWrapCommand(t *testing.T) {
	cmd := `warden calibrate --prometheus http://localhost:9090 --model meta-llama/Llama-3.1-70B-Instruct --gpu "H100 SXM" --max-num-seqs 1024 --since 1h --out farm.yaml`
	got := wrapCommand(cmd, 60, "   ")
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	if len(lines) < 3 {
		t.Fatalf("not wrapped:\n%s", got)
	}
	var joined []string
	for i, l := range lines {
		if utf8.RuneCountInString(l) > 60 {
			t.Errorf("line %q over 60 columns", l)
		}
		last := i == len(lines)-1
		if strings.HasSuffix(l, ` \`) == last {
			t.Errorf("line %q: a backslash at the end of every line but the last", l)
		}
		joined = append(joined, strings.TrimSpace(strings.TrimSuffix(l, ` \`)))
	}
	if back := strings.Join(joined, " "); back != cmd {
		t.Errorf("joined back:\n%s\nwant\n%s", back, cmd)
	}
	if !strings.Contains(got, `"H100 SXM"`) {
		t.Errorf("the quoted GPU name was split:\n%s", got)
	}
}
