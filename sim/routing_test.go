package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/traces"
)

func TestParseFarmRouting(t *testing.T) {
	base := "model: Qwen/Qwen3-4B-Instruct-2507\ngpu: RTX A4000\n"
	f, err := ParseFarm([]byte(base+"routing:\n  balance: kv\n  spill_threshold: priced\n  admission: kv\n  admission_timeout: 45s\n"), "farm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if f.Balance != placement.BalanceKV || f.Admission != placement.AdmissionKV || !f.Spill.Priced() || f.Spec.Routing.AdmissionTimeout != Duration(45*time.Second) {
		t.Errorf("resolved balance %v admission %v spill %v timeout %v", f.Balance, f.Admission, f.Spill, f.Spec.Routing.AdmissionTimeout)
	}
	d, err := ParseFarm([]byte(base), "farm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if d.Balance != placement.BalanceSessions || d.Admission != placement.AdmissionOff || d.Spill.Priced() {
		t.Errorf("defaults: balance %v admission %v spill %v, want sessions, off, auto", d.Balance, d.Admission, d.Spill)
	}
	for _, tt := range []struct{ name, yaml, want string }{
		{"bad balance", "routing:\n  balance: tokens\n", `farm.yaml:4: routing.balance: want sessions or kv, got "tokens"`},
		{"bad admission", "routing:\n  admission: yes\n", `farm.yaml:4: routing.admission: want off or kv, got "yes"`},
		{"bad timeout", "routing:\n  admission_timeout: -5s\n", "farm.yaml:4: routing.admission_timeout: must be >= 0"},
		{"bad spill", "routing:\n  spill_threshold: cheap\n", "farm.yaml:4: routing.spill_threshold: " + placement.SpillThresholdError("cheap")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseFarm([]byte(base+tt.yaml), "farm.yaml")
			if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
				t.Errorf("error = %v, want prefix %q", err, tt.want)
			}
		})
	}
}

func TestVariants(t *testing.T) {
	f := mustDefaultFarm(t)
	// The grammar's cases are placement's (TestParseSpec); here, that a
	// spec reaches the run with its label and its errors.
	for _, tt := range []struct{ strategy, name, err string }{
		{"affinity", "affinity", ""},
		{"least-loaded", "least-loaded", ""},
		{"affinity+admit=1m30s+priced", "affinity (priced, admit 1m30s)", ""},
		{placement.PeerLLMD, placement.PeerLLMD, ""},
		{"affinity+fast", "", `unknown option "fast"`},
	} {
		v, err := newVariant(f, tt.strategy, f.Spill)
		switch {
		case tt.err != "":
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s: error %v, want %q", tt.strategy, err, tt.err)
			}
		case err != nil:
			t.Errorf("%s: %v", tt.strategy, err)
		case v.name != tt.name:
			t.Errorf("%s: name %q, want %q", tt.strategy, v.name, tt.name)
		}
	}
	// The farm's routing block sets the options of plain affinity.
	g, err := ParseFarm([]byte("model: Qwen/Qwen3-4B-Instruct-2507\ngpu: RTX A4000\nrouting:\n  admission: kv\n"), "farm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := newVariant(g, "affinity", g.Spill); v.name != "affinity (admit)" || v.cfg.Admission != placement.AdmissionKV {
		t.Errorf("affinity on a farm with admission: kv is %q %+v", v.name, v.cfg)
	}
	if v, _ := newVariant(g, "affinity+admit=45s", g.Spill); v.timeout != 45*time.Second || v.name != "affinity (admit 45s)" {
		t.Errorf("admit=45s on a farm with admission: kv: timeout %v, name %q", v.timeout, v.name)
	}
	if got := placement.SpecLabel("affinity+admit+kv=x"); got != "affinity+admit+kv=x" {
		t.Errorf("SpecLabel of a bad variant = %q, want it unchanged", got)
	}
	if got := placement.SpecLabel("affinity+admit=20s+kv"); got != "affinity (kv, admit 20s)" {
		t.Errorf("SpecLabel = %q", got)
	}
	if r := mustRun(t, f, "affinity"); r.kv != nil {
		t.Error("plain affinity feeds the KV-aware router: defaults must be unchanged")
	}
	r := mustRun(t, f, "affinity+priced")
	if r.kv == nil || r.snap.Replicas[0].KVCapacityTokens != f.KVTokensPerReplica() || !(r.snap.Replicas[0].PrefillTokensPerSec > 1000) {
		t.Errorf("priced run: capacity %d (want %d), prefill rate %v", r.snap.Replicas[0].KVCapacityTokens, f.KVTokensPerReplica(), r.snap.Replicas[0].PrefillTokensPerSec)
	}
}

func mustRun(t *testing.T, f *Farm, strategy string) *run {
	t.Helper()
	r, err := newRun(f, strategy, f.Spill)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestAdmissionWaitCountsInTTFB runs the reference farm (4 x A4000) at 24
// sessions, past what its KV cache holds: with admission some first turns
// wait at the router, and their wait is in the client-side TTFB, in the
// records and in the step's TTFB quantiles; the admitted sessions keep
// their prefix cache.
func TestAdmissionWaitCountsInTTFB(t *testing.T) {
	dir := filepath.Join("testdata", "validation")
	farm, err := LoadFarm(filepath.Join(dir, "farm.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := traces.LoadWorkload(filepath.Join(dir, "workload.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	rep, err := Run(context.Background(), Experiment{Farm: farm, Workload: w, Strategies: []string{"affinity", "affinity+kv+admit"},
		Sessions: []int{24}, Duration: 2 * time.Minute, Seed: 1, Requests: &buf})
	if err != nil {
		t.Fatal(err)
	}
	plain, admit := rep.Rows[0], rep.Rows[1]
	if admit.Strategy != "affinity (kv, admit)" {
		t.Fatalf("row strategy %q", admit.Strategy)
	}
	var maxFirst, maxLater float64
	sc := bufio.NewScanner(&buf)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec RequestRecord
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Strategy != admit.Strategy || math.IsNaN(float64(rec.TTFBS)) {
			continue
		}
		if rec.Turn == 0 {
			maxFirst = max(maxFirst, float64(rec.TTFBS))
		} else {
			maxLater = max(maxLater, float64(rec.TTFBS))
		}
	}
	if maxFirst < 10 {
		t.Errorf("longest first-turn TTFB with admission %.1f s: no conversation waited for admission", maxFirst)
	}
	if got := float64(admit.direct.ttfbP95); got < 10 || got > maxFirst+1e-9 {
		t.Errorf("TTFB p95 %.1f s with admission: the waits (up to %.1f s) are not in the step's quantiles", got, maxFirst)
	}
	if maxLater >= maxFirst {
		t.Errorf("later turns waited up to %.1f s, first turns %.1f s: admitted sessions must not wait", maxLater, maxFirst)
	}
	if float64(admit.PrefixHitPct) < float64(plain.PrefixHitPct)+20 {
		t.Errorf("hit %% with admission %.1f, plain affinity %.1f: admission should keep the caches", admit.PrefixHitPct, plain.PrefixHitPct)
	}
	if admit.Unfinished != 0 && admit.Unfinished > int64(24) {
		t.Errorf("unfinished %d without a timeout: more than the requests cut at the end", admit.Unfinished)
	}
}

// TestAdmissionTimeout: with routing.admission_timeout, a conversation that
// waited longer is refused (unfinished), its wait counted in its TTFB.
func TestAdmissionTimeout(t *testing.T) {
	dir := filepath.Join("testdata", "validation")
	data, err := os.ReadFile(filepath.Join(dir, "farm.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	data = bytes.Replace(data, []byte("  session_ttl: 30m\n"), []byte("  session_ttl: 30m\n  admission: kv\n  admission_timeout: 5s\n"), 1)
	farm, err := ParseFarm(data, "farm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	w, err := traces.LoadWorkload(filepath.Join(dir, "workload.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	rep, err := Run(context.Background(), Experiment{Farm: farm, Workload: w, Strategies: []string{"affinity"},
		Sessions: []int{24}, Duration: 2 * time.Minute, Seed: 1, Requests: &buf})
	if err != nil {
		t.Fatal(err)
	}
	row := rep.Rows[0]
	if row.Strategy != "affinity (admit)" {
		t.Fatalf("strategy %q", row.Strategy)
	}
	refused := 0
	sc := bufio.NewScanner(&buf)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec RequestRecord
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		// Refused after its 5 s wait, censored or not: a refusal as the
		// step closes is marked censored (its wait counted once, there).
		if rec.Turn == 0 && !rec.Finished && float64(rec.TTFBS) > 5 && float64(rec.TTFBS) < 7 {
			refused++
		}
		if rec.Turn == 0 && rec.Finished && float64(rec.TTFBS) > 5+w.Downlink().Seconds()+60 {
			t.Errorf("a first turn waited %.1f s, far past the 5 s admission timeout", float64(rec.TTFBS))
		}
	}
	if refused == 0 || row.Unfinished < int64(refused) {
		t.Errorf("refused first turns %d (TTFB just over 5 s), unfinished %d: the timeout did not refuse", refused, row.Unfinished)
	}
	// The refused requests' waits are in the TTFB KPIs too (PromQL over
	// warden_ttfb_seconds), not only in the exact quantiles.
	for _, q := range []struct {
		what      string
		got, want float64
	}{{"p50", float64(row.TTFBP50), row.direct.ttfbP50}, {"p95", float64(row.TTFBP95), row.direct.ttfbP95}} {
		if rel := math.Abs(q.got-q.want) / q.want; !(rel <= 0.02) {
			t.Errorf("TTFB %s: PromQL %.3f s, exact %.3f s (refusals' waits included): %.1f%% off", q.what, q.got, q.want, 100*rel)
		}
	}
	if row.AdmissionRefused != int64(refused) || row.AdmissionWaits < row.AdmissionRefused {
		t.Errorf("row counts %d waits, %d refused; the records show %d refused", row.AdmissionWaits, row.AdmissionRefused, refused)
	}

	// The variant affinity+admit=5s on the farm without admission is the
	// same run: only its name differs.
	plain, err := LoadFarm(filepath.Join(dir, "farm.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	vrep, err := Run(context.Background(), Experiment{Farm: plain, Workload: w, Strategies: []string{"affinity+admit=5s"},
		Sessions: []int{24}, Duration: 2 * time.Minute, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	vrow := vrep.Rows[0]
	if vrow.Strategy != "affinity (admit 5s)" {
		t.Fatalf("variant's strategy %q", vrow.Strategy)
	}
	vrow.Strategy = row.Strategy
	a, _ := json.Marshal(row)
	b, _ := json.Marshal(vrow)
	if !bytes.Equal(a, b) {
		t.Errorf("affinity+admit=5s differs from routing.admission_timeout 5s:\n%s\n%s", b, a)
	}
}

// TestVariantsSameSeedSameJSON: the KV-aware variants are as deterministic
// as the seed's strategies (the admission FIFO, the prefill queue).
func TestVariantsSameSeedSameJSON(t *testing.T) {
	f := mustDefaultFarm(t)
	e := Experiment{Farm: f, Strategies: []string{"affinity+kv+priced+admit", "affinity+priced"}, Sessions: []int{8, 24}, Duration: time.Minute, Seed: 7}
	var out [2][]byte
	for i := range out {
		rep, err := Run(context.Background(), e)
		if err != nil {
			t.Fatal(err)
		}
		if out[i], err = json.Marshal(rep); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(out[0], out[1]) {
		t.Errorf("two runs with seed 7 differ:\n%s\n%s", out[0], out[1])
	}
}
