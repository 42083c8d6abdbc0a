package planner

import (
	"slices"
	"strings"
	"unicode/utf8"
)

// wrapText breaks s into lines of at most width characters at spaces (a
// word longer than width, a path say, stands on a line of its own), each
// ending in a newline; its own newlines are kept.
func wrapText(s string, width int) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		n := 0
		var words []string
		for _, w := range strings.Fields(line) {
			if strings.HasPrefix(w, "%") && len(words) > 0 {
				words[len(words)-1] += " " + w // "5 %" stays on one line
				continue
			}
			words = append(words, w)
		}
		for _, word := range words {
			wl := utf8.RuneCountInString(word)
			switch {
			case n == 0:
			case n+1+wl > width:
				b.WriteByte('\n')
				n = 0
			default:
				b.WriteByte(' ')
				n++
			}
			b.WriteString(word)
			n += wl
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// wrapCommand writes a shell command indented, broken at spaces outside
// double quotes with a backslash at the end of each line but the last, so
// that it stays within width and still pastes into a shell as one command.
func wrapCommand(cmd string, width int, indent string) string {
	var words []string
	var cur strings.Builder
	quoted := false
	for _, r := range cmd {
		switch {
		case r == '"':
			quoted = !quoted
			cur.WriteRune(r)
		case r == ' ' && !quoted:
			if cur.Len() > 0 {
				words = append(words, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
		}
	}
	if cur.Len() > 0 {
		words = append(words, cur.String())
	}
	// A flag and its value stay on one line.
	for i := 0; i+1 < len(words); i++ {
		if strings.HasPrefix(words[i], "--") && !strings.Contains(words[i], "=") && !strings.HasPrefix(words[i+1], "-") {
			words = slices.Replace(words, i, i+2, words[i]+" "+words[i+1])
		}
	}
	var b strings.Builder
	line := indent
	for i, w := range words {
		switch {
		case i == 0:
			line += w
		case utf8.RuneCountInString(line)+1+utf8.RuneCountInString(w)+2 > width:
			b.WriteString(line + " \\\n")
			line = indent + "  " + w
		default:
			line += " " + w
		}
	}
	b.WriteString(line + "\n")
	return b.String()
}
