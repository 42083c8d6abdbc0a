package planner

import (
	"fmt"
	"slices"
	"time"

	"github.com/lm-warden/warden/sim"
)

// A journal recorded behind `warden emulate --speed N` holds turns that
// finished N times faster than the farm could run them: the emulator's
// model runs on a compressed clock while the proxy journals wall time. Its
// arrivals and think times are wall time too, so a replay on the real
// farm's speed puts N times the load on it and answers nothing a buyer
// asked. The journal does not say which clock it was recorded on; its
// turns do.
//
// A turn's wall duration is known from the next turn of its session: the
// journal writes think_ms as the gap from the end of one answer to the
// next request (live/journal.go), so
//
//	duration(k) = t_ms(k+1) - think_ms(k+1) - t_ms(k).
//
// Against it stands the least time the farm can take to decode the turn's
// output, output_tokens x sim.Farm.DecodeFloor (the weights read once per
// token at the full memory bandwidth, no prefill, no queueing). Real vLLM
// does not beat that floor; with speculative decoding it could, by up to
// the accepted draft length (about 2 on agent traffic), so the check only
// speaks when the median turn ran more than compressionWarnFactor times
// faster than the floor.
const (
	// compressionWarnFactor: the median turn ran this many times faster
	// than the decode floor before tune warns.
	compressionWarnFactor = 2
	// compressionMinTurns: fewer measurable turns say nothing.
	compressionMinTurns = 10
	// compressionMinOutput: turns with fewer output tokens are dominated
	// by prefill and the proxy's own time, and skipped.
	compressionMinOutput = 32
)

// Compression is what the check found.
type Compression struct {
	Turns  int     // turns measured
	Factor float64 // median of floor time / wall duration: > 1 ran faster than the farm can
}

// JournalCompression measures t's turns against f's decode floor.
func JournalCompression(t *sim.Trace, f *sim.Farm) Compression {
	floor := f.DecodeFloor()
	if floor <= 0 {
		return Compression{}
	}
	type last struct {
		at     int64
		output int
	}
	prev := map[string]last{}
	var ratios []float64
	for _, r := range t.Requests {
		if p, ok := prev[r.Session]; ok && p.output >= compressionMinOutput {
			wall := time.Duration(r.ArrivalMs-r.ThinkMs-p.at) * time.Millisecond
			if wall > 0 { // <= 0: a file boundary or a late record; unknown
				ratios = append(ratios, float64(floor)*float64(p.output)/float64(wall))
			}
		}
		prev[r.Session] = last{at: r.ArrivalMs, output: r.OutputTokens}
	}
	if len(ratios) == 0 {
		return Compression{}
	}
	slices.Sort(ratios)
	return Compression{Turns: len(ratios), Factor: ratios[len(ratios)/2]}
}

// compressionNote is tune's warning when c says the journal ran on a
// faster clock than f, "" otherwise.
func compressionNote(c Compression, f *sim.Farm) string {
	if c.Turns < compressionMinTurns || c.Factor <= compressionWarnFactor {
		return ""
	}
	return fmt.Sprintf("the journal's turns ran %.0fx faster than %s can decode (median of %d turns, against %s a token at full memory bandwidth): "+
		"was it recorded behind `warden emulate --speed`? Then its arrivals and think times are compressed as much, and this replay loads the farm that many times harder than the traffic did; "+
		"record at --speed 1, or replay on a farm spec with speed_scale set to the emulator's speed",
		c.Factor, f.Name(), c.Turns, f.DecodeFloor().Round(10*time.Microsecond))
}
