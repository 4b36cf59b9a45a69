package promtext

import (
	"strconv"
	"strings"
)

// maxNames is how many names a Names lists; the rest are counted.
const maxNames = 3

// Names collects the names a round's error lists (the targets that failed),
// keeping the first three and counting the rest, so that a log line names
// every failing target of a small fleet and stays short for a large one.
// The zero value is empty and ready to use.
type Names struct {
	names [maxNames]string
	n     int
}

// Add records name.
func (l *Names) Add(name string) {
	if l.n < maxNames {
		l.names[l.n] = name
	}
	l.n++
}

// Len reports how many names were added.
func (l *Names) Len() int { return l.n }

// String returns the names quoted, in the order added: `"a", "b", "c" and
// 2 more`; "" when none was added.
func (l *Names) String() string {
	var b strings.Builder
	for i := range min(l.n, maxNames) {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Quote(l.names[i]))
	}
	if l.n > maxNames {
		b.WriteString(" and ")
		b.WriteString(strconv.Itoa(l.n - maxNames))
		b.WriteString(" more")
	}
	return b.String()
}

// Bracketed returns the names in brackets after a space, ` ("a", "b")`,
// or "" when none was added: what follows a count in a message.
func (l *Names) Bracketed() string {
	if l.n == 0 {
		return ""
	}
	return " (" + l.String() + ")"
}
