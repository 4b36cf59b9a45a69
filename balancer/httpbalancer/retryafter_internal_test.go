package httpbalancer

import (
	"math/big"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/inferlb/inferlb/internal/testutil"
)

// retryAfterRef is retryAfter's model, in exact arithmetic: a whole
// number of seconds of any size, else an HTTP date (its distance from
// now), kept within 0 to a day; 0 for anything else.
func retryAfterRef(v string, now time.Time) time.Duration {
	const day = 24 * time.Hour
	s := strings.TrimSpace(v)
	if n, ok := new(big.Int).SetString(s, 10); ok {
		switch {
		case n.Sign() < 0:
			return 0
		case n.Cmp(big.NewInt(int64(day/time.Second))) > 0:
			return day
		}
		return time.Duration(n.Int64()) * time.Second
	}
	if t, err := http.ParseTime(s); err == nil {
		return min(max(t.Sub(now), 0), day)
	}
	return 0
}

// FuzzRetryAfter: a server's Retry-After, whatever it says and whenever
// it comes, is a hint present (ok), between 0 and a day, that agrees with
// the exact reading.
func FuzzRetryAfter(f *testing.F) {
	for _, s := range []string{
		"120", "0", "-5", "+7", " 30 ", "99999999999999999999", "-99999999999999999999", "99999999999999999999x",
		"1.5", "0x10", "1_000", "", "Wed, 21 Oct 2015 07:28:00 GMT", "Sunday, 06-Nov-94 08:49:37 GMT",
		"Sun Nov  6 08:49:37 1994", "Fri, 31 Dec 9999 23:59:59 GMT", "Mon, 07 Dec 2026 11:00:30 GMT",
	} {
		f.Add(s, int64(0))
		f.Add(s, int64(1_800_000_000))
	}
	f.Fuzz(func(t *testing.T, v string, nowUnix int64) {
		clock := testutil.NewClock()
		if nowUnix != 0 {
			clock.Set(time.Unix(nowUnix, 0))
		}
		d, ok := retryAfter(http.Header{"Retry-After": {v}}, clock)
		if !ok {
			t.Fatalf("Retry-After %q: not seen", v)
		}
		if d < 0 || d > 24*time.Hour {
			t.Fatalf("Retry-After %q: %v", v, d)
		}
		if want := retryAfterRef(v, clock.Now()); d != want {
			t.Fatalf("Retry-After %q at %v: %v, want %v", v, clock.Now(), d, want)
		}
	})
}
