package sse

import (
	"strings"
	"testing"
)

// frame feeds stream in chunks of the given sizes (the rest in one last
// chunk) and returns the events ("type|data", "!" for an overlong one)
// and the absolute offset of each Write's LastEnd.
func frame(stream string, max int, sizes ...int) (events []string, cuts []int, p *Parser) {
	p = &Parser{Max: max, OnEvent: func(e Event) {
		if e.Overlong {
			events = append(events, "!")
			return
		}
		events = append(events, string(e.Type)+"|"+string(e.Data))
	}}
	off := 0
	write := func(b string) {
		p.Write([]byte(b))
		if e := p.LastEnd(); e >= 0 {
			cuts = append(cuts, off+e)
		}
		off += len(b)
	}
	for _, n := range sizes {
		n = min(n, len(stream)-off)
		write(stream[off : off+n])
	}
	write(stream[off:])
	return events, cuts, p
}

func lastCut(cuts []int) int {
	if len(cuts) == 0 {
		return -1
	}
	return cuts[len(cuts)-1]
}

func TestLineEndings(t *testing.T) {
	for _, tc := range []struct {
		name, stream string
		events       []string
		end          int // LastEnd of the whole stream in one Write
		mid          bool
	}{
		{"LF", "data: a\n\ndata: b\n\n", []string{"|a", "|b"}, 18, false},
		{"CRLF", "data: a\r\n\r\ndata: b\r\n\r\n", []string{"|a", "|b"}, 22, false},
		{"CR", "data: a\r\rdata: b\r\r", []string{"|a", "|b"}, 18, false},
		{"LF then CRLF", "data: a\n\r\ndata: b\n\r\n", []string{"|a", "|b"}, 20, false},
		{"LF then CR", "data: a\n\rdata: b\n\r", []string{"|a", "|b"}, 18, false},
		{"CRLF then CR", "data: a\r\n\rdata: b\r\n\r", []string{"|a", "|b"}, 20, false},
		{"CR then CRLF", "data: a\r\r\ndata: b\r\r\n", []string{"|a", "|b"}, 20, false},
		{"CRLF then LF", "data: a\r\n\ndata: b\r\n\n", []string{"|a", "|b"}, 20, false},
		{"mixed", "event: x\r\ndata: 1\rdata: 2\n\r\n: note\r\n\r\nevent: y\rdata:3\n\n", []string{"x|1\n2", "y|3"}, 55, false},
		{"no end yet", "data: a\n\ndata: b\r\n", []string{"|a"}, 9, true},
		{"a lone CR ends a line only", "data: a\r", nil, -1, true},
		{"blank lines only", "\n\r\n\r", nil, 4, false},
		{"comment only", ": keep-alive\n\n", nil, 14, false},
		{"empty data", "data\n\ndata:\n\n", []string{"|", "|"}, 13, false},
		{"spaces", "data:  two\ndata:none\n\n", []string{"| two\nnone"}, 22, false},
		{"comments and every ending", "event: a\ndata: 1\ndata: 2\n\n: comment\n\r\ndata:x\r\n\r\nevent: b\rdata: y\r\r", []string{"a|1\n2", "|x", "b|y"}, 66, false},
		{"other fields", "id: 1\nretry: 5\ndata: a\n\n", []string{"|a"}, 24, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			events, cuts, p := frame(tc.stream, 0)
			if strings.Join(events, ",") != strings.Join(tc.events, ",") || lastCut(cuts) != tc.end || p.Mid() != tc.mid {
				t.Fatalf("whole: events %q end %d mid %v; want %q %d %v", events, lastCut(cuts), p.Mid(), tc.events, tc.end, tc.mid)
			}
			// Split at every byte boundary: the same events, the same last
			// cut, and no cut inside an event.
			for cut := 0; cut <= len(tc.stream); cut++ {
				events, cuts, p := frame(tc.stream, 0, cut)
				if strings.Join(events, ",") != strings.Join(tc.events, ",") || lastCut(cuts) != tc.end || p.Mid() != tc.mid {
					t.Fatalf("split at %d: events %q end %d mid %v; want %q %d %v", cut, events, lastCut(cuts), p.Mid(), tc.events, tc.end, tc.mid)
				}
				for _, c := range cuts {
					if _, _, q := frame(tc.stream[:c], 0); q.Mid() {
						t.Fatalf("split at %d: cut at %d is inside an event", cut, c)
					}
				}
			}
			// One byte at a time.
			ones := make([]int, len(tc.stream))
			for i := range ones {
				ones[i] = 1
			}
			if events, cuts, _ := frame(tc.stream, 0, ones...); strings.Join(events, ",") != strings.Join(tc.events, ",") || lastCut(cuts) != tc.end {
				t.Fatalf("byte by byte: events %q end %d", events, lastCut(cuts))
			}
		})
	}
}

func TestOverlong(t *testing.T) {
	big := strings.Repeat("x", 100)
	for _, tc := range []struct {
		name, stream string
		events       []string
	}{
		{"long line", "data: " + big + "\n\ndata: ok\n\n", []string{"!", "|ok"}},
		{"long data over lines", "data: " + big[:40] + "\ndata: " + big[:40] + "\n\ndata: ok\n\n", []string{"!", "|ok"}},
		{"long comment", ":" + big + "\ndata: a\n\n", []string{"!"}},
		{"just fits", "data: " + big[:58] + "\n\n", []string{"|" + big[:58]}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for cut := 0; cut <= len(tc.stream); cut++ {
				events, _, _ := frame(tc.stream, 64, cut)
				if strings.Join(events, ",") != strings.Join(tc.events, ",") {
					t.Fatalf("split at %d: events %q, want %q", cut, events, tc.events)
				}
			}
		})
	}
}

func TestFlush(t *testing.T) {
	var got []string
	p := Parser{OnEvent: func(e Event) { got = append(got, string(e.Type)+"|"+string(e.Data)) }}
	p.Write([]byte("data: a\n\nevent: e\ndata: b"))
	p.Flush()
	if strings.Join(got, ",") != "|a,e|b" || p.Mid() {
		t.Errorf("events %q mid %v after Flush, want the last event without its blank line", got, p.Mid())
	}
}

// FuzzFraming: chunking the stream changes neither the events nor the
// last cut, and no cut falls inside an event.
func FuzzFraming(f *testing.F) {
	f.Add("event: a\ndata: 1\n\ndata: [DONE]\n\n", uint8(3), uint8(5))
	f.Add("data: x\r\n\r\ndata: y\n\r\n", uint8(1), uint8(9))
	f.Add("data: a\r\rdata: b\r\n\r: c\n\n", uint8(7), uint8(2))
	f.Fuzz(func(t *testing.T, stream string, a, b uint8) {
		max := 32 + int(b)
		whole, wcuts, wp := frame(stream, max)
		var sizes []int
		for n, i := 0, 0; n < len(stream); i++ {
			s := int(a>>(i%8))%7 + 1
			if i%2 == 1 {
				s = int(b)%5 + 1
			}
			sizes = append(sizes, s)
			n += s
		}
		parts, pcuts, pp := frame(stream, max, sizes...)
		if strings.Join(whole, "\x00") != strings.Join(parts, "\x00") {
			t.Fatalf("events whole %q, in chunks %q", whole, parts)
		}
		if lastCut(wcuts) != lastCut(pcuts) || wp.Mid() != pp.Mid() {
			t.Fatalf("last cut whole %d, in chunks %d (mid %v, %v)", lastCut(wcuts), lastCut(pcuts), wp.Mid(), pp.Mid())
		}
		for _, c := range pcuts {
			if _, _, q := frame(stream[:c], max); q.Mid() {
				t.Fatalf("cut at %d is inside an event", c)
			}
		}
	})
}
