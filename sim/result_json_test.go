package sim

import (
	"encoding/json"
	"math"
	"testing"
)

func TestFloatJSONRoundTrip(t *testing.T) {
	tests := []struct {
		in   Float
		json string
	}{
		{1.23456, "1.235"},
		{0, "0"},
		{Float(math.NaN()), "null"},
		{-0.0001, "0"},
	}
	for _, tc := range tests {
		b, err := json.Marshal(tc.in)
		if err != nil || string(b) != tc.json {
			t.Fatalf("Marshal(%v) = %s, %v; want %s", tc.in, b, err, tc.json)
		}
		var back Float
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if math.IsNaN(float64(tc.in)) != math.IsNaN(float64(back)) || (!math.IsNaN(float64(back)) && float64(back) != round3(float64(tc.in))) {
			t.Errorf("round trip of %v gave %v", tc.in, back)
		}
	}
	var f Float
	if err := json.Unmarshal([]byte(`"x"`), &f); err == nil {
		t.Error(`Unmarshal("x") succeeded; want an error`)
	}
}
