package procs

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestNext(t *testing.T) {
	tests := []struct {
		name          string
		cur, max, low int
		busy          float64
		want, wantLow int
	}{
		{"light load stays on one", 1, 8, 0, 0.36, 1, 0},
		{"past 60 % of one: two", 1, 8, 0, 0.65, 2, 0},
		{"saturated one: double", 1, 8, 0, 0.95, 2, 0},
		{"saturated four: eight", 4, 8, 0, 3.8, 8, 0},
		{"saturated at the most: stays", 8, 8, 0, 7.9, 8, 0},
		{"past 60 % of three: four", 3, 8, 5, 1.9, 4, 0},
		{"under 50 % of one fewer: counts", 2, 8, 3, 0.4, 2, 4},
		{"under 50 % long enough: one fewer", 2, 8, holdDown - 1, 0.4, 1, 0},
		{"between the thresholds: resets the count", 3, 8, 7, 1.1, 3, 0},
		{"never under one", 1, 8, holdDown, 0, 1, 0},
		{"one CPU", 1, 1, 0, 1, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, gotLow := Next(tt.cur, tt.max, tt.busy, tt.low)
			if got != tt.want || gotLow != tt.wantLow {
				t.Errorf("Next(%d, %d, %.2f, %d) = %d, %d; want %d, %d", tt.cur, tt.max, tt.busy, tt.low, got, gotLow, tt.want, tt.wantLow)
			}
		})
	}
}

// TestNoOscillation: whatever the load, a change is never undone at the
// next interval by the same load (what is dropped to is below upAt).
func TestNoOscillation(t *testing.T) {
	for cur := 2; cur <= 16; cur++ {
		for busy := 0.0; busy < float64(cur); busy += 0.01 {
			next, _ := Next(cur, 16, busy, holdDown)
			if next < cur {
				if back, _ := Next(next, 16, busy, 0); back > next {
					t.Fatalf("at %.2f busy cores: %d -> %d -> %d", busy, cur, next, back)
				}
			}
		}
	}
}

// TestRun drives the governor with a CPU clock that the test advances:
// a load of 1.5 cores takes it from one P up, an idle process back down,
// and it stops with its context.
func TestRun(t *testing.T) {
	defer goleak.VerifyNone(t)
	var mu sync.Mutex
	var cpu time.Duration
	var load float64 // busy cores
	set := make(chan int, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	const tick = 5 * time.Millisecond
	go func() {
		defer close(done)
		Run(ctx, Options{Max: 4, Interval: tick,
			CPU: func() time.Duration {
				mu.Lock()
				defer mu.Unlock()
				return cpu
			},
			Set: func(n int) { set <- n }})
	}()
	advance := func() {
		mu.Lock()
		cpu += time.Duration(load * float64(tick/5)) // load cores over tick/5
		mu.Unlock()
	}
	stop := time.NewTicker(tick / 5)
	defer stop.Stop()
	wait := func(want int) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case n := <-set:
				if n == want {
					return
				}
			case <-stop.C:
				advance()
			case <-deadline:
				t.Fatalf("GOMAXPROCS never set to %d", want)
			}
		}
	}
	wait(1) // it starts on one
	mu.Lock()
	load = 5 // well over what one P can show: it doubles
	mu.Unlock()
	wait(2)
	mu.Lock()
	load = 0
	mu.Unlock()
	wait(1)
	cancel()
	<-done
}
