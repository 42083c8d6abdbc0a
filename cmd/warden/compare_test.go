package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeFile writes data to name in dir and returns the path.
func writeFile(t *testing.T, dir, name, data string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const (
	comparePredicted = `{"farm":"4x RTX A4000, Qwen3-4B","rows":[
{"strategy":"least-loaded","sessions":4,"sessions_per_hour":120,"output_tokens_per_min":9000,"ttfb_p50_s":0.5,"ttfb_p95_s":1.2,"replicas_busy":3.1,"prefix_hit_pct":60,"stayed_pct":30,"miss_tokens":{"cold":0,"evicted":0,"elsewhere":0,"partial":0},"replicas":[],"duration_s":180,"finished":10,"unfinished":1,"preemptions":0},
{"strategy":"affinity","sessions":4,"sessions_per_hour":130,"output_tokens_per_min":9500,"ttfb_p50_s":0.3,"ttfb_p95_s":0.9,"replicas_busy":3.4,"prefix_hit_pct":88,"stayed_pct":100,"miss_tokens":{"cold":0,"evicted":0,"elsewhere":0,"partial":0},"replicas":[],"duration_s":180,"finished":10,"unfinished":1,"preemptions":0}]}`
	compareObserved = `{"farm":"bench of http://127.0.0.1:8080","rows":[
{"strategy":"affinity","sessions":4,"sessions_per_hour":125,"output_tokens_per_min":9400,"ttfb_p50_s":0.33,"ttfb_p95_s":1.0,"replicas_busy":3.3,"prefix_hit_pct":86,"stayed_pct":null,"miss_tokens":{"cold":0,"evicted":0,"elsewhere":0,"partial":0},"replicas":[],"duration_s":180,"finished":10,"unfinished":1,"preemptions":0}]}`
)

func TestCompareCommand(t *testing.T) {
	dir := t.TempDir()
	pred := writeFile(t, dir, "sim.json", comparePredicted)
	obs := writeFile(t, dir, "bench.json", compareObserved)
	html := filepath.Join(dir, "compare.html")
	out, err := execWarden(t, "compare", "--predicted", pred, "--observed", obs, "--out", html)
	if err != nil {
		t.Fatal(err)
	}
	flat := strings.Join(strings.Fields(out), " ")
	for _, want := range []string{"4 affinity prefix hit % 88.0 86.0 -2.0 pts (-2.3%)",
		"4 affinity TTFB p50 s 0.30 0.33 +10.0%", "without a partner: predicted least-loaded @ 4", "report: " + html} {
		if !strings.Contains(flat, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	first, err := os.ReadFile(html)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := execWarden(t, "compare", "--predicted", pred, "--observed", obs, "--out", html); err != nil {
		t.Fatal(err)
	}
	if second, _ := os.ReadFile(html); string(first) != string(second) {
		t.Error("two reports of the same inputs differ")
	}
	js, err := execWarden(t, "compare", "--predicted", pred, "--observed", obs, "--json")
	if err != nil || !strings.Contains(js, `"column": "prefix_hit_pct"`) || !strings.Contains(js, `"points": -2`) {
		t.Errorf("--json: %v\n%s", err, js)
	}
}

func TestCompareErrors(t *testing.T) {
	dir := t.TempDir()
	pred := writeFile(t, dir, "sim.json", comparePredicted)
	obs := writeFile(t, dir, "bench.json", compareObserved)
	other := writeFile(t, dir, "other.json", strings.ReplaceAll(compareObserved, `"affinity"`, `"observed"`))
	bad := writeFile(t, dir, "bad.json", `{"farm":"x","rows":[],"extra":1}`)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--observed", obs}, `required flag(s) "predicted" not set`},
		{[]string{"--predicted", pred, "--observed", bad}, "bad.json: want a warden sim --json or warden bench --json report"},
		{[]string{"--predicted", pred, "--observed", filepath.Join(dir, "none.json")}, "none.json"},
		{[]string{"--predicted", pred, "--observed", other}, "no step matches"},
		{[]string{"--predicted", pred, "--observed", obs, "--observed", obs}, "appears twice"},
		{[]string{"--predicted", pred, "--observed", other, "--strategy", "hash"}, `strategy "hash"`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, err := execWarden(t, append([]string{"compare"}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
	// Named strategy: the unlabelled run is compared with affinity.
	out, err := execWarden(t, "compare", "--predicted", pred, "--observed", other, "--strategy", "affinity")
	if err != nil || !strings.Contains(out, "affinity / observed") {
		t.Errorf("--strategy affinity: %v\n%s", err, out)
	}
}
