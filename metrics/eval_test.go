package metrics

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"go.uber.org/goleak"

	"github.com/lm-warden/warden/metrics/names"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestInstantAndScalar(t *testing.T) {
	s := testStore(t) // "up" x3 and "down", samples every 10 ms up to 90 ms
	ev := NewEvaluator()
	ctx := context.Background()
	at := time.UnixMilli(90)
	tests := []struct {
		expr    string
		want    float64 // for Scalar; NaN for an empty result
		wantErr string
	}{
		{expr: `1 + 1`, want: 2},
		{expr: `sum(up)`, want: 9 + 109 + 209},
		{expr: `down`, want: 309},
		{expr: `nothing_here`, want: math.NaN()},
		{expr: `up`, wantErr: "3 series"},
		{expr: `up[1m]`, wantErr: "want an instant vector or scalar"},
		{expr: `sum(`, wantErr: "metrics: query"},
		{expr: `"text"`, wantErr: "want an instant vector or scalar"},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			got, err := ev.Scalar(ctx, s, tt.expr, at)
			switch {
			case tt.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("error %v, want one containing %q", err, tt.wantErr)
				}
			case err != nil:
				t.Fatal(err)
			case math.IsNaN(tt.want) != math.IsNaN(got) || (!math.IsNaN(got) && got != tt.want):
				t.Errorf("Scalar = %v, want %v", got, tt.want)
			}
		})
	}
	v, err := ev.Instant(ctx, s, `up{job="a"}`, at)
	if err != nil || len(v) != 2 || v[0].T != 90 {
		t.Errorf("Instant(up{job=a}) = %v, %v; want 2 samples at t=90", v, err)
	}
}

func TestLookbackDelta(t *testing.T) {
	s := NewStore()
	s.Series(labels.FromStrings(names.LabelName, "g")).Append(0, 7)
	ev := NewEvaluator()
	for _, tc := range []struct {
		at   time.Duration
		want float64
	}{{LookbackDelta - time.Millisecond, 7}, {LookbackDelta, math.NaN()}} {
		got, err := ev.Scalar(context.Background(), s, "g", time.UnixMilli(0).Add(tc.at))
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want && !(math.IsNaN(got) && math.IsNaN(tc.want)) {
			t.Errorf("g at %v = %v, want %v", tc.at, got, tc.want)
		}
	}
}

func TestRange(t *testing.T) {
	s := testStore(t)
	ev := NewEvaluator()
	ctx := context.Background()
	m, err := ev.Range(ctx, s, `down`, time.UnixMilli(0), time.UnixMilli(90), 30*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	check := func() {
		t.Helper()
		if len(m) != 1 || len(m[0].Floats) != 4 {
			t.Fatalf("Range = %v, want 1 series of 4 points", m)
		}
		for i, p := range m[0].Floats {
			if want := float64(300 + 3*i); p.T != int64(30*i) || p.F != want {
				t.Errorf("point %d = (%d, %v), want (%d, %v)", i, p.T, p.F, 30*i, want)
			}
		}
	}
	check()
	// The result must not share the engine's pooled buffers.
	for range 3 {
		if _, err := ev.Range(ctx, s, `sum(up) * 1000`, time.UnixMilli(0), time.UnixMilli(90), 30*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	check()
	for _, bad := range []struct {
		start, end int64
		step       time.Duration
	}{{0, 90, 0}, {90, 0, time.Millisecond}} {
		if _, err := ev.Range(ctx, s, `up`, time.UnixMilli(bad.start), time.UnixMilli(bad.end), bad.step); err == nil {
			t.Errorf("Range(%d, %d, %v): no error", bad.start, bad.end, bad.step)
		}
	}
}

func TestContextCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := NewEvaluator().Instant(ctx, NewStore(), "1", time.UnixMilli(0)); err == nil {
		t.Error("cancelled context: no error")
	}
}
