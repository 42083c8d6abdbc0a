package strictyaml

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestDurationRules: one duration, two rules for negatives, each with the
// wording of its files.
func TestDurationRules(t *testing.T) {
	type anySign struct {
		D Duration[AnySign] `yaml:"d"`
	}
	type nonNeg struct {
		D Duration[NonNegative] `yaml:"d"`
	}
	var a anySign
	if _, err := Decode("a.yaml", []byte("d: -1m\n"), &a); err != nil || a.D.D() != -time.Minute {
		t.Errorf("AnySign -1m: %v, %v", a.D.D(), err)
	}
	var n nonNeg
	if _, err := Decode("n.yaml", []byte("d: 90s\n"), &n); err != nil || n.D.D() != 90*time.Second {
		t.Errorf("NonNegative 90s: %v, %v", n.D.D(), err)
	}
	for _, tc := range []struct {
		v    any
		yaml string
		want string
	}{
		{&anySign{}, "d: soon\n", `a.yaml:1: d: "soon" is not a duration (want e.g. 1s, 30m, 100us)`},
		{&anySign{}, "d: [1s]\n", "a.yaml:1: d: want a duration such as 1s or 30m"},
		{&nonNeg{}, "d: -1m\n", `a.yaml:1: d: want a duration such as 1s or 30m, got "-1m"`},
		{&nonNeg{}, "d: soon\n", `a.yaml:1: d: want a duration such as 1s or 30m, got "soon"`},
	} {
		_, err := Decode("a.yaml", []byte(tc.yaml), tc.v)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%T %q: error %v, want %q", tc.v, tc.yaml, err, tc.want)
		}
	}
	b, err := json.Marshal(anySign{D: Duration[AnySign](1500 * time.Millisecond)})
	if err != nil || string(b) != `{"D":"1.5s"}` {
		t.Errorf("JSON %s, %v", b, err)
	}
	var back anySign
	if err := json.Unmarshal(b, &back); err != nil || back.D.D() != 1500*time.Millisecond {
		t.Errorf("JSON round trip: %v, %v", back.D.D(), err)
	}
}
