package kvevents

import (
	"context"
	"encoding/binary"
	"net"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// The benchmarks of this file measure what a misbehaving publisher costs
// the subscriber (memory allocated and CPU time, per message or batch),
// the figures issue 46 gave before the bounds. Run them one at a time:
//
//	go test -run - -bench 'Hostile|Flood|SnapshotDuring' -benchtime 1x ./kvevents/

// cpuTime is the process's user and system time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// measureHostile serves a message of n frames, each body, after a
// handshake to one subscriber until it refuses it (or reads it whole), and
// reports the bytes allocated and the CPU time spent meanwhile. The frames
// are written one by one (the message is never whole in memory here).
func measureHostile(b *testing.B, n int, body []byte) {
	var ms0, ms1 runtime.MemStats
	for b.Loop() {
		b.StopTimer()
		runtime.GC()
		written := make(chan struct{})
		p := startHostile(b, func(c net.Conn, n int) {
			if n == 1 {
				defer close(written)
				if _, err := c.Write(append(zmtpGreeting(), zmtpReady("PUB")...)); err != nil {
					return
				}
				var batch []byte // small frames are written a thousand at a time
				for i := range n {
					more := byte(0x01)
					if i == n-1 {
						more = 0
					}
					hdr := []byte{more, byte(len(body))}
					if len(body) > 255 {
						hdr = binary.BigEndian.AppendUint64([]byte{more | 0x02}, uint64(len(body)))
					}
					if len(body) > 64<<10 { // large: written as it is, never copied
						if _, err := c.Write(hdr); err != nil {
							return
						}
						if _, err := c.Write(body); err != nil {
							return
						}
						continue
					}
					if batch = append(append(batch, hdr...), body...); len(batch) >= 64<<10 || i == n-1 {
						if _, err := c.Write(batch); err != nil {
							return
						}
						batch = batch[:0]
					}
				}
			}
		})
		h := &recorder{}
		runtime.ReadMemStats(&ms0)
		cpu0 := cpuTime()
		b.StartTimer()
		stop := followUntil(p, h)
		<-written
		// The message was refused (the write failed) or read whole; give
		// the subscriber the time to take it.
		time.Sleep(100 * time.Millisecond)
		b.StopTimer()
		runtime.ReadMemStats(&ms1)
		b.ReportMetric(float64(ms1.TotalAlloc-ms0.TotalAlloc)/(1<<20), "MiB-alloc/msg")
		b.ReportMetric((cpuTime() - cpu0).Seconds(), "cpu-s/msg")
		stop()
		p.ln.Close()
		b.StartTimer()
	}
}

// BenchmarkHostileMessage80x15MiB: one message of 80 frames of 15 MiB,
// each under the frame bound (1.27 GB before messages were bounded).
func BenchmarkHostileMessage80x15MiB(b *testing.B) {
	measureHostile(b, 80, make([]byte, 15<<20))
}

// BenchmarkHostileMessage10M1Byte: one message of ten million 1-byte
// frames (450 MB and 22 s of CPU before frames per message were bounded).
func BenchmarkHostileMessage10M1Byte(b *testing.B) {
	measureHostile(b, 10_000_000, []byte{0})
}

// BenchmarkFlood: CPU time per batch of a publisher that sends 26,000
// small batches as fast as it can (a core at 26k batches/s before the
// bound on batches per second).
func BenchmarkFlood(b *testing.B) {
	const n = 26_000
	var flood []byte
	for i := range n {
		flood = append(flood, batchMessage(uint64(i))...)
	}
	for b.Loop() {
		b.StopTimer()
		p := startHostile(b, func(c net.Conn, k int) {
			if k == 1 {
				_, _ = c.Write(append(zmtpGreeting(), zmtpReady("PUB")...))
				_, _ = c.Write(flood)
			}
		})
		farm := NewFarm(1, 0, 0)
		cpu0 := cpuTime()
		b.StartTimer()
		stop := followUntil(p, farm.Replica(0))
		for s := farm.Snapshot()[0]; s.Batches+s.Dropped < n; s = farm.Snapshot()[0] {
			time.Sleep(time.Millisecond)
		}
		b.StopTimer()
		b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/n, "cpu-ns/batch")
		s := farm.Snapshot()[0]
		b.ReportMetric(float64(s.Dropped), "dropped")
		stop()
		p.ln.Close()
		b.StartTimer()
	}
}

// BenchmarkSnapshotDuringBatch: a status read while another goroutine
// counts batches of 1.7 million hashes (2.2 s before Snapshot stopped
// taking the farm's lock).
func BenchmarkSnapshotDuringBatch(b *testing.B) {
	f := NewFarm(2, 0, 0)
	hashes := make([]uint64, 1_700_000)
	for i := range hashes {
		hashes[i] = uint64(i)
	}
	done, stopped := make(chan struct{}), make(chan struct{})
	counting := make(chan struct{}, 1)
	go func() {
		defer close(stopped)
		for seq := uint64(0); ; seq++ {
			select {
			case <-done:
				return
			default:
			}
			select {
			case counting <- struct{}{}:
			default:
			}
			f.Replica(0).Batch(seq, &Batch{Events: []Event{stored(hashes...), removed(hashes...)}})
		}
	}()
	<-counting
	var worst time.Duration
	for b.Loop() {
		t0 := time.Now()
		_ = f.Snapshot()
		worst = max(worst, time.Since(t0))
	}
	b.ReportMetric(worst.Seconds()*1e3, "worst-ms")
	close(done)
	<-stopped
}

// followUntil subscribes h to p; the returned func stops it and waits.
func followUntil(p *hostilePub, h Handler) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		_ = Subscribe(ctx, SubscribeOptions{Endpoint: p.endpoint(), Retry: time.Hour}, h)
		close(done)
	}()
	return func() { cancel(); <-done }
}
