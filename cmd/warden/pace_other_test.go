//go:build !linux

package main

import "time"

// pacer sends an open loop's requests on time where it can
// (pace_linux_test.go); elsewhere it sleeps with time.Sleep.
type pacer struct{}

func newPacer() *pacer { return &pacer{} }

func (*pacer) until(t time.Time) {
	if d := time.Until(t); d > 0 {
		time.Sleep(d)
	}
}

func (*pacer) stop() {}
