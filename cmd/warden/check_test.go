package main

import (
	"strings"
	"testing"
)

// FuzzPredictedKPIs feeds untrusted prediction files to the reader of
// `warden check`: it returns values or an error naming the file, never
// panics.
func FuzzPredictedKPIs(f *testing.F) {
	f.Add([]byte(`{"farm":"x","rows":[{"strategy":"affinity","sessions":8,"prefix_hit_pct":80.5,"ttfb_p95_s":null}]}`), "", 0)
	f.Add([]byte(`{"kind":"warden-plan","best":-1,"closest":-1}`), "affinity", 8)
	f.Add([]byte(`not json`), "", 0)
	f.Fuzz(func(t *testing.T, data []byte, strategy string, sessions int) {
		m, err := predictedKPIs(data, "p.json", strategy, sessions)
		if err != nil {
			if !strings.Contains(err.Error(), "p.json") {
				t.Errorf("error without the file name: %v", err)
			}
			return
		}
		if len(m) == 0 {
			t.Error("no KPI and no error")
		}
	})
}

func TestParseTolerance(t *testing.T) {
	for _, c := range []struct {
		in   string
		want float64
		ok   bool
	}{{"10%", 0.1, true}, {"0.25", 0.25, true}, {" 5 % ", 0.05, true}, {"-1%", 0, false}, {"NaN", 0, false}, {"x", 0, false}} {
		got, err := parseTolerance(c.in)
		if (err == nil) != c.ok || (c.ok && got != c.want) {
			t.Errorf("parseTolerance(%q) = %g, %v; want %g, ok %v", c.in, got, err, c.want, c.ok)
		}
	}
}
