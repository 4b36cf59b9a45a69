package promtext

import (
	"strings"

	"github.com/inferlb/inferlb/internal/errtext"
)

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
	return errtext.Reworded(err, m)
}
