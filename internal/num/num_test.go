package num

import (
	"math"
	"testing"
)

func TestQuantile(t *testing.T) {
	for _, c := range []struct {
		v    []float64
		q    float64
		want float64
	}{
		{[]float64{3, 1, 2}, 0.5, 2},
		{[]float64{1, 2}, 0.5, 1.5},
		{[]float64{1, 2, 3, 4, 5}, 0.95, 4.8},
		{[]float64{5, 4, 3, 2, 1}, 0, 1},
		{[]float64{5, 4, 3, 2, 1}, 1, 5},
		{[]float64{7}, 0.95, 7},
	} {
		in := append([]float64(nil), c.v...)
		if got := QuantileOf(c.v, c.q); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("QuantileOf(%v, %v) = %v, want %v", c.v, c.q, got, c.want)
		}
		for i := range in {
			if in[i] != c.v[i] {
				t.Fatalf("QuantileOf reordered its input: %v", c.v)
			}
		}
	}
	if !math.IsNaN(Quantile(nil, 0.5)) || !math.IsNaN(QuantileOf(nil, 0.5)) {
		t.Error("no values: want NaN")
	}
}

func TestFormat(t *testing.T) {
	for _, c := range []struct {
		v    float64
		d    int
		want string
	}{
		{1234567.891, 2, "1,234,567.89"},
		{999.5, 0, "1,000"},
		{-12345, 1, "-12,345.0"},
		{0.25, 3, "0.250"},
		{math.NaN(), 1, "-"},
		{math.Inf(1), 0, "-"},
	} {
		if got := Format(c.v, c.d); got != c.want {
			t.Errorf("Format(%v, %d) = %q, want %q", c.v, c.d, got, c.want)
		}
	}
	if got := Int(-9876543210); got != "-9,876,543,210" {
		t.Errorf("Int = %q", got)
	}
}
