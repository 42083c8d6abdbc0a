// Package sse frames Server-Sent Events streams, fed in chunks of any
// size, by the WHATWG rules (HTML, "Server-sent events", the event stream
// interpretation): a line ends at CRLF, LF or CR; a blank line dispatches
// the event; "event:" sets its type, each "data:" adds a line to its data
// (one leading space after the colon dropped); a line starting with a
// colon is a comment. The proxy watches and cuts streams with it; the
// load generator reads them with it: one framer, so that both agree on
// where an event ends.
package sse

import "bytes"

// DefaultMax is the bound on the bytes of one event that a Parser with
// Max 0 keeps.
const DefaultMax = 1 << 20

// Event is one dispatched event. Its slices are valid during the OnEvent
// call only.
type Event struct {
	Type    []byte // the last "event:" value; empty for the default "message"
	Data    []byte // the "data:" values joined by \n
	HasData bool   // at least one "data:" line (Data may still be empty)
	// Overlong is set when the event outgrew Parser.Max: it was framed
	// correctly but its fields were not kept (Type and Data are empty).
	Overlong bool
}

// Parser frames one stream. The zero value is ready (with DefaultMax);
// set OnEvent to see the events. It never changes the bytes, it only
// watches them, so a proxy can pass them on as they came.
type Parser struct {
	// Max bounds the bytes kept of one event (its current line, its data);
	// 0 means DefaultMax.
	Max int
	// OnEvent is called at the blank line that ends each event with at
	// least one "event:" or "data:" field, or that outgrew Max.
	OnEvent func(Event)

	line     []byte
	lineSeen bool // the current line has a byte (kept or not)
	lineOver bool // the current line outgrew Max
	typ      []byte
	data     []byte
	hasData  bool
	hasType  bool
	over     bool // the current event outgrew Max
	mid      bool // inside a line or an event
	lastCR   bool // the last byte written was a CR: a LF next belongs to it
	crBlank  bool // ...and that CR ended a blank line
	lastEnd  int
}

func (p *Parser) max() int {
	if p.Max > 0 {
		return p.Max
	}
	return DefaultMax
}

// Write feeds b to the parser, calling OnEvent for each event completed in
// it. It never fails.
func (p *Parser) Write(b []byte) (int, error) {
	p.lastEnd = -1
	i := 0
	if p.lastCR {
		p.lastCR = false
		if len(b) > 0 && b[0] == '\n' {
			i = 1
			if p.crBlank {
				p.lastEnd = 1
			}
		}
		p.crBlank = false
	}
	for i < len(b) {
		j := bytes.IndexAny(b[i:], "\r\n")
		if j < 0 {
			p.appendLine(b[i:])
			break
		}
		p.appendLine(b[i : i+j])
		end := i + j + 1
		if b[i+j] == '\r' {
			if end == len(b) {
				p.lastCR = true
			} else if b[end] == '\n' {
				end++
			}
		}
		if p.endLine() {
			p.lastEnd = end
			p.crBlank = p.lastCR
		}
		i = end
	}
	return len(b), nil
}

// LastEnd returns, after a Write, the offset in its bytes just past the
// last blank line (the end of an event: a safe place to cut the stream),
// or -1 if none ended in them. A CRLF split between two Writes counts
// whole: the LF is included when it comes.
func (p *Parser) LastEnd() int { return p.lastEnd }

// Mid reports that the bytes so far stop inside a line or an event.
func (p *Parser) Mid() bool { return p.mid }

// PendingLF reports that the last byte was a CR, which a LF may still
// join (the stream reads the same whether or not one comes).
func (p *Parser) PendingLF() bool { return p.lastCR }

// Flush ends the stream: a last line without its line ending is taken as
// a line, and an event without its blank line is dispatched. (The
// standard drops such an event; a client that wants to know what came
// may call Flush.)
func (p *Parser) Flush() {
	if p.lineSeen {
		p.endLine()
	}
	if p.mid {
		p.dispatch()
	}
	p.lastCR, p.crBlank = false, false
}

func (p *Parser) appendLine(b []byte) {
	if len(b) == 0 {
		return
	}
	p.lineSeen, p.mid = true, true
	if p.lineOver {
		return
	}
	if len(p.line)+len(b) > p.max() {
		p.lineOver, p.over = true, true
		p.line = p.line[:0]
		return
	}
	p.line = append(p.line, b...)
}

// endLine processes the current line; it reports a blank line.
func (p *Parser) endLine() bool {
	line, seen, over := p.line, p.lineSeen, p.lineOver
	p.line, p.lineSeen, p.lineOver = p.line[:0], false, false
	if !seen {
		p.dispatch()
		return true
	}
	p.mid = true
	if over || line[0] == ':' { // too long to read, or a comment
		return false
	}
	field, value := line, []byte(nil)
	if i := bytes.IndexByte(line, ':'); i >= 0 {
		field, value = line[:i], line[i+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(field) {
	case "event":
		p.typ = append(p.typ[:0], value...)
		p.hasType = true
	case "data":
		if p.over {
			return false
		}
		if len(p.data)+len(value)+1 > p.max() {
			p.over = true
			p.data = p.data[:0]
			return false
		}
		if p.hasData {
			p.data = append(p.data, '\n')
		}
		p.data = append(p.data, value...)
		p.hasData = true
	}
	return false
}

func (p *Parser) dispatch() {
	if p.OnEvent != nil {
		switch {
		case p.over:
			p.OnEvent(Event{Overlong: true})
		case p.hasData || p.hasType:
			p.OnEvent(Event{Type: p.typ, Data: p.data, HasData: p.hasData})
		}
	}
	p.typ, p.data = p.typ[:0], p.data[:0]
	p.hasData, p.hasType, p.over, p.mid = false, false, false, false
}
