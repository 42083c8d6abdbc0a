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
		name      string
		cur, max  int
		busy      float64
		st        State
		want      int
		wantState State
	}{
		{"light load stays on one", 1, 8, 0.36, State{}, 1, State{}},
		{"under 75 % of one: stays", 1, 8, 0.7, State{}, 1, State{}},
		{"past 75 % of one, once: waits", 1, 8, 0.8, State{}, 1, State{High: 1}},
		{"past 75 % of one, for long: two", 1, 8, 0.8, State{High: holdUp - 1}, 2, State{}},
		{"past 75 % of one, not yet long: waits", 1, 8, 0.8, State{High: holdUp - 2}, 1, State{High: holdUp - 1}},
		{"a burst, once: waits", 1, 8, 1.2, State{}, 1, State{High: 1}},
		{"saturated one, for long: double", 1, 8, 0.95, State{High: holdUp - 1}, 2, State{}},
		{"saturated four, for long: eight", 4, 8, 3.8, State{High: holdUp - 1}, 8, State{}},
		{"saturated at the most: stays", 8, 8, 7.9, State{High: 5}, 8, State{N: 1, Sum: 7.9}},
		{"past 75 % of three: four", 3, 8, 2.3, State{High: holdUp - 1}, 4, State{}},
		{"the step-down window fills", 2, 8, 0.6, State{N: 3, Sum: 1.8}, 2, State{N: 4, Sum: 2.4}},
		{"its mean under 70 % of one fewer: one fewer", 2, 8, 0.6, State{N: holdDown - 1, Sum: 0.65 * (holdDown - 1)}, 1, State{}},
		{"its mean over 70 % of one fewer: stays, a new window", 2, 8, 0.6, State{N: holdDown - 1, Sum: 0.8 * (holdDown - 1)}, 2, State{}},
		{"a high interval empties the window", 3, 8, 2.5, State{N: 7, Sum: 7}, 3, State{High: 1}},
		{"never under one", 1, 8, 0, State{}, 1, State{}},
		{"one CPU", 1, 1, 1, State{High: 3}, 1, State{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, gotState := Next(tt.cur, tt.max, tt.busy, tt.st)
			if got != tt.want || gotState != tt.wantState {
				t.Errorf("Next(%d, %d, %.2f, %+v) = %d, %+v; want %d, %+v", tt.cur, tt.max, tt.busy, tt.st, got, gotState, tt.want, tt.wantState)
			}
		})
	}
}

// TestNoOscillation: a step down is never undone by the same load (what
// it steps down to is under upAt), however long that load lasts.
func TestNoOscillation(t *testing.T) {
	for cur := 2; cur <= 16; cur++ {
		for busy := 0.0; busy < float64(cur); busy += 0.01 {
			next, _ := Next(cur, 16, busy, State{N: holdDown - 1, Sum: busy * (holdDown - 1)})
			if next >= cur {
				continue
			}
			st := State{}
			for range 2 * holdUp {
				var back int
				if back, st = Next(next, 16, busy, st); back > next {
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
	load = 1.5 // past what one P can hold
	mu.Unlock()
	wait(2)
	mu.Lock()
	load = 0
	mu.Unlock()
	wait(1)
	cancel()
	<-done
}
