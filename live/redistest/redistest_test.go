package redistest

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartStopRestart(t *testing.T) {
	s := Start(t)
	if err := ping(s.Addr); err != nil {
		t.Fatalf("after Start: %v", err)
	}
	s.Stop()
	if err := ping(s.Addr); err == nil {
		t.Fatal("after Stop: PING still answered")
	}
	s.Restart()
	if err := ping(s.Addr); err != nil {
		t.Fatalf("after Restart: %v", err)
	}
}
