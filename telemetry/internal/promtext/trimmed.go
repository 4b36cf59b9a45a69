package promtext

import "strings"

// Trimmed returns err with prefixes taken off the front of its message, each
// in turn where it is there, so that a Source naming a target's error after
// its own prefix does not repeat it ("modelserver: ...; first: endpoint
// "a": modelserver: scrape: ..."). errors.Is and errors.As see err as it
// was; err is returned as it is when no prefix was there.
func Trimmed(err error, prefixes ...string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	m := msg
	for _, p := range prefixes {
		m = strings.TrimPrefix(m, p)
	}
	if m == msg {
		return err
	}
	return trimmed{err, m}
}

type trimmed struct {
	err error
	msg string
}

func (t trimmed) Error() string { return t.msg }
func (t trimmed) Unwrap() error { return t.err }
