package placement

import (
	"fmt"
	"testing"
	"time"
)

// pickAt sends one request of session at at through a, on 4 idle healthy
// replicas, and returns its replica.
func pickAt(t *testing.T, a *Affinity, session string, at time.Time) int {
	t.Helper()
	s := &Snapshot{MaxNumSeqs: 32, Replicas: make([]Replica, 4)}
	for i := range s.Replicas {
		s.Replicas[i] = Replica{ID: i, Healthy: true}
	}
	a.Table().Advance(at)
	a.Table().Fill(s)
	d, err := a.Pick(&Request{Session: session}, s, at)
	if err != nil {
		t.Fatal(err)
	}
	return d.Replica
}

// TestLearnedActiveWindow: with Config.ActiveWindow zero the window is
// learned from the gaps between a conversation's requests. Conversations
// of 50 turns that pause 10 minutes every tenth turn (seconds otherwise)
// teach a window that spans the pause (paused conversations still count on
// their home); turns a few seconds apart keep DefaultActiveWindow; a fixed
// window never moves; the same requests give the same window.
func TestLearnedActiveWindow(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// drive runs conversations of 50 turns, 8 at a time, for the given
	// gaps, and returns the window the table ends with.
	drive := func(cfg Config, gap func(turn int) time.Duration) (*Affinity, time.Duration) {
		a := NewAffinity(cfg)
		type conv struct {
			id   string
			turn int
			next time.Time
		}
		convs := make([]conv, 8)
		n := 0
		for i := range convs {
			convs[i] = conv{id: fmt.Sprint("c", n), next: base.Add(time.Duration(i) * time.Second)}
			n++
		}
		for range 4000 {
			k := 0
			for i := range convs {
				if convs[i].next.Before(convs[k].next) {
					k = i
				}
			}
			c := &convs[k]
			pickAt(t, a, c.id, c.next)
			c.turn++
			if c.turn == 50 {
				*c = conv{id: fmt.Sprint("c", n), next: c.next.Add(time.Second)}
				n++
				continue
			}
			c.next = c.next.Add(gap(c.turn))
		}
		return a, a.Table().ActiveWindow()
	}
	paused := func(turn int) time.Duration {
		if turn%10 == 0 {
			return 10 * time.Minute
		}
		return 5 * time.Second
	}
	quick := func(int) time.Duration { return 3 * time.Second }

	a, w := drive(Config{}, paused)
	if !a.Table().LearnsWindow() {
		t.Fatal("a zero ActiveWindow does not learn")
	}
	if w < 10*time.Minute || w > 15*time.Minute {
		t.Errorf("learned window %v with 10-minute pauses every tenth turn, want 10m-15m (spanning the pause)", w)
	}
	// A paused conversation still counts on its home: the 8 conversations
	// in progress are all active (with those that ended within the window).
	active := 0
	for _, c := range a.Table().Counters() {
		active += c.Active
	}
	if active < 8 {
		t.Errorf("%d conversations active, want at least the 8 in progress (paused ones included)", active)
	}
	if _, again := drive(Config{}, paused); again != w {
		t.Errorf("same requests, window %v then %v", w, again)
	}
	if _, w := drive(Config{}, quick); w != DefaultActiveWindow {
		t.Errorf("turns 3 s apart: window %v, want the floor %v", w, DefaultActiveWindow)
	}
	if _, w := drive(Config{ActiveWindow: time.Minute}, paused); w != time.Minute {
		t.Errorf("fixed 1m window moved to %v", w)
	}
	// Under a 5m TTL a 10-minute pause forgets the conversation: it comes
	// back as a new one, no gap, and the window keeps its floor.
	if _, w := drive(Config{SessionTTL: 5 * time.Minute}, paused); w != DefaultActiveWindow {
		t.Errorf("learned window %v under a 5m TTL, want the floor %v (pauses past the TTL are new conversations)", w, DefaultActiveWindow)
	}
}
