package hardware

import (
	"strings"
	"testing"
)

func TestPriceList(t *testing.T) {
	ps := Prices()
	if len(ps) < 5 {
		t.Fatalf("price list holds %d prices", len(ps))
	}
	for _, p := range ps {
		if got, ok := LookupPrice(p.GPU); !ok || got != p {
			t.Errorf("LookupPrice(%q) = %+v, %v", p.GPU, got, ok)
		}
		if p.Source == "" || p.AsOf == "" || !(p.USDPerGPUHour > 0) {
			t.Errorf("incomplete price %+v", p)
		}
	}
	// Aliases find the same price; a GPU the list leaves out has none.
	if p, ok := LookupPrice("h100"); !ok || p.GPU != "H100 SXM" {
		t.Errorf("LookupPrice(h100) = %+v, %v", p, ok)
	}
	for _, g := range []string{"RTX A4000", "no such card"} {
		if p, ok := LookupPrice(g); ok {
			t.Errorf("LookupPrice(%q) = %+v, want none", g, p)
		}
	}
	// Kinds compare: a dearer, faster card costs more per hour.
	h, _ := LookupPrice("H100 SXM")
	l, _ := LookupPrice("L40S")
	if h.USDPerGPUHour <= l.USDPerGPUHour {
		t.Errorf("H100 SXM %g <= L40S %g per hour", h.USDPerGPUHour, l.USDPerGPUHour)
	}
}

func TestParsePricesErrors(t *testing.T) {
	for _, tt := range []struct {
		name, yaml string
		want       []string
	}{
		{"unknown gpu", "- {gpu: Voodoo 5, usd_per_gpu_hour: 1, as_of: 2026-03-10, source: s}", []string{"entry 1", "Voodoo 5"}},
		{"zero price", "- {gpu: L40S, usd_per_gpu_hour: 0, as_of: 2026-03-10, source: s}", []string{"entry 1", "usd_per_gpu_hour"}},
		{"NaN price", "- {gpu: L40S, usd_per_gpu_hour: .nan, as_of: 2026-03-10, source: s}", []string{"usd_per_gpu_hour"}},
		{"bad date", "- {gpu: L40S, usd_per_gpu_hour: 1, as_of: March 2026, source: s}", []string{"as_of", "YYYY-MM-DD"}},
		{"no source", "- {gpu: L40S, usd_per_gpu_hour: 1, as_of: 2026-03-10}", []string{"source"}},
		{"twice", "- {gpu: L40S, usd_per_gpu_hour: 1, as_of: 2026-03-10, source: s}\n- {gpu: l40s, usd_per_gpu_hour: 2, as_of: 2026-03-10, source: s}", []string{"entry 2", "twice"}},
		{"unknown key", "- {gpu: L40S, usd_per_gpu_hour: 1, as_of: 2026-03-10, source: s, currency: EUR}", []string{"prices.yaml", "currency"}},
	} {
		_, err := parsePrices([]byte(tt.yaml))
		wantErrContains(t, tt.name, err, tt.want)
	}
}

// wantErrContains fails the test unless err holds every string of want.
func wantErrContains(t *testing.T, name string, err error, want []string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error", name)
		return
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: error %q lacks %q", name, err, w)
		}
	}
}

// FuzzParsePrices checks that a price list either fails with an error
// naming the file or gives complete, catalogue-named, distinct prices.
func FuzzParsePrices(f *testing.F) {
	f.Add(pricesYAML)
	f.Add([]byte("- {gpu: L40S, usd_per_gpu_hour: .inf, as_of: 2026-03-10, source: s}"))
	f.Add([]byte("null"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ps, err := parsePrices(data)
		if err != nil {
			if !strings.Contains(err.Error(), "catalog/prices.yaml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		seen := map[string]bool{}
		for _, p := range ps {
			if _, err := LookupGPU(p.GPU); err != nil || seen[p.GPU] || !positive(p.USDPerGPUHour) || p.Source == "" {
				t.Fatalf("accepted %+v", p)
			}
			seen[p.GPU] = true
		}
	})
}
