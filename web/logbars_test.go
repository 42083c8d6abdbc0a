package web

import (
	"slices"
	"testing"
)

// TestLogBars: bars on a log axis start at the power of ten below the
// smallest value, and seconds under one become milliseconds (marks too),
// so that no bar hangs down from 1.
func TestLogBars(t *testing.T) {
	for _, tc := range []struct {
		name     string
		y        Axis
		values   []float64
		mark     float64
		wantName string
		wantY    []float64
		wantMark float64
		wantMin  float64
	}{
		{"seconds over one", Axis{Name: "seconds", Log: true, Seconds: true}, []float64{2.5, 30}, 10, "seconds", []float64{2.5, 30}, 10, 1},
		{"seconds under one", Axis{Name: "TTFB p95, seconds", Log: true, Seconds: true}, []float64{0.2, 0.58}, 0.5, "TTFB p95, milliseconds", []float64{200, 580}, 500, 100},
		{"a mark under one", Axis{Name: "seconds", Log: true, Seconds: true}, []float64{2, 3}, 0.05, "milliseconds", []float64{2000, 3000}, 50, 10},
		{"not seconds", Axis{Name: "ratio", Log: true}, []float64{0.03, 4}, 0, "ratio", []float64{0.03, 4}, 0, 0.01},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Series{Name: "p95", Y: slices.Clone(tc.values)}
			if tc.mark > 0 {
				s.Marks = []Mark{{Name: "target", Y: ptr(tc.mark)}}
			}
			y, got := logBars(tc.y, []Series{s})
			if y.Name != tc.wantName || y.Min == nil || *y.Min != tc.wantMin {
				t.Fatalf("axis %q min %v, want %q min %v", y.Name, y.Min, tc.wantName, tc.wantMin)
			}
			for i, v := range got[0].Y {
				if d := v - tc.wantY[i]; d > 1e-9 || d < -1e-9 {
					t.Errorf("value %d: %v, want %v", i, v, tc.wantY[i])
				}
			}
			if tc.mark > 0 && *got[0].Marks[0].Y != tc.wantMark {
				t.Errorf("mark %v, want %v", *got[0].Marks[0].Y, tc.wantMark)
			}
			if !slices.Equal(s.Y, tc.values) {
				t.Errorf("the caller's series changed: %v", s.Y)
			}
		})
	}
}
