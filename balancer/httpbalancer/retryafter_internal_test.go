package httpbalancer

import (
	"errors"
	"math"
	"math/big"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inferlb/inferlb/internal/testutil"
)

// decimalSeconds is the syntax of a Retry-After in seconds: digits with
// an optional sign and fraction, at least one digit.
var decimalSeconds = regexp.MustCompile(`^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)$`)

// retryAfterRef is retryAfter's model, in exact arithmetic: a number of
// seconds of any size, possibly fractional (truncated to the nanosecond),
// else an HTTP date (its distance from now), kept within 0 to a day; 0
// for anything else.
func retryAfterRef(v string, now time.Time) time.Duration {
	const day = 24 * time.Hour
	s := strings.TrimSpace(v)
	if decimalSeconds.MatchString(s) {
		r, ok := new(big.Rat).SetString(s)
		if !ok {
			panic(s)
		}
		r.Mul(r, new(big.Rat).SetInt64(int64(time.Second)))
		ns := new(big.Int).Quo(r.Num(), r.Denom()) // truncated
		switch {
		case ns.Sign() < 0:
			return 0
		case ns.Cmp(big.NewInt(int64(day))) > 0:
			return day
		}
		return time.Duration(ns.Int64())
	}
	if t, err := http.ParseTime(s); err == nil {
		return min(max(t.Sub(now), 0), day)
	}
	return 0
}

// retryAfterMsRef is retryAfterMs's model: the value, kept within 0 to
// a day, of what strconv.ParseFloat reads (the syntax openai-go accepts),
// times a millisecond in exact arithmetic; ok false for what openai-go
// skips for Retry-After (no number, negative, NaN, infinite). A number
// past float64's range is a day.
func retryAfterMsRef(v string) (exact *big.Float, ok bool) {
	const day = 24 * time.Hour
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if errors.Is(err, strconv.ErrRange) && math.IsInf(f, 1) {
		return new(big.Float).SetInt64(int64(day)), true
	}
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return nil, false
	}
	ns := new(big.Float).SetPrec(0).SetFloat64(f) // exact: precision of f
	ns.SetPrec(1000).Mul(ns, big.NewFloat(float64(time.Millisecond)))
	if ns.Cmp(new(big.Float).SetInt64(int64(day))) > 0 {
		return new(big.Float).SetInt64(int64(day)), true
	}
	return ns, true
}

// TestRetryAfterSeconds: Retry-After in seconds, whole as RFC 9110 has
// it or with a fraction, as gateways send it and the OpenAI SDKs read it
// (openai-go waits 1.5 s for "1.5"). Before, a fraction was no number:
// the hint was none, and the endpoint cooled down for the default second.
func TestRetryAfterSeconds(t *testing.T) {
	clock := testutil.NewClock()
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"120", 120 * time.Second},
		{"0", 0},
		{"+7", 7 * time.Second},
		{"-5", 0},
		{" 30 ", 30 * time.Second},
		{"86400", 24 * time.Hour},
		{"86401", 24 * time.Hour},
		{"99999999999999999999", 24 * time.Hour},
		{"-99999999999999999999", 0},
		{"1.5", 1500 * time.Millisecond},
		{"0.25", 250 * time.Millisecond},
		{".5", 500 * time.Millisecond},
		{"2.", 2 * time.Second},
		{"+1.5", 1500 * time.Millisecond},
		{"-1.5", 0},
		{"-.5", 0},
		{"0.000000001", time.Nanosecond},
		{"0.0000000019", time.Nanosecond}, // truncated, as openai-go converts
		{"1.123456789123", time.Second + 123456789},
		{"86399.9999999999", 24*time.Hour - time.Nanosecond},
		{"86400.5", 24 * time.Hour},
		{"99999999999999999999.5", 24 * time.Hour},
		// No number of seconds, and no date: seen, no hint.
		{".", 0}, {"-", 0}, {"+.", 0}, {"1..5", 0}, {"1.5.", 0}, {"1,5", 0}, {"1e3", 0},
		{"0x10", 0}, {"1_000", 0}, {"inf", 0}, {"NaN", 0}, {"1.5s", 0}, {"", 0},
		{clock.Now().Add(5 * time.Second).Format(http.TimeFormat), 5 * time.Second},
	} {
		d, ok := retryAfter(http.Header{"Retry-After": {tc.in}}, clock)
		if !ok || d != tc.want {
			t.Errorf("Retry-After %q: %v %v, want %v", tc.in, d, ok, tc.want)
		}
		if ref := retryAfterRef(tc.in, clock.Now()); ref != tc.want {
			t.Errorf("retryAfterRef(%q) = %v, want %v", tc.in, ref, tc.want)
		}
	}
}

// FuzzRetryAfter: a server's hint, whatever it says and whenever it comes,
// is seen when either header is present, between 0 and a day, and agrees
// with the exact reading: retry-after-ms when it is a valid number (to the
// nanosecond: the product of two float64s rounds), else Retry-After.
func FuzzRetryAfter(f *testing.F) {
	for _, s := range []string{
		"120", "0", "-5", "+7", " 30 ", "99999999999999999999", "-99999999999999999999", "99999999999999999999x",
		"1.5", "0.25", ".5", "2.", "-1.5", "+.5", ".", "1e3", "86399.9999999999", "0.0000000019",
		"99999999999999999999.5", "0x10", "1_000", "", "Wed, 21 Oct 2015 07:28:00 GMT", "Sunday, 06-Nov-94 08:49:37 GMT",
		"Sun Nov  6 08:49:37 1994", "Fri, 31 Dec 9999 23:59:59 GMT", "Mon, 07 Dec 2026 11:00:30 GMT",
	} {
		f.Add(s, true, "", false, int64(0))
		f.Add(s, true, "", false, int64(1_800_000_000))
		f.Add(s, true, "250", true, int64(0))
		f.Add(s, true, "soon", true, int64(0))
	}
	for _, ms := range []string{
		"250", "250.7", "0", "-0", "-5", " 100 ", "+100", ".5", "1e3", "0x1p3", "1_000", "86400000", "86400001",
		"1e20", "1e400", "-1e400", "1e-400", "4.9e-324", "inf", "-Inf", "NaN", "", "soon", "100ms",
	} {
		f.Add("", false, ms, true, int64(0))
		f.Add("7", true, ms, true, int64(0))
	}
	f.Add("", false, "", false, int64(0))
	f.Fuzz(func(t *testing.T, ra string, hasRA bool, ms string, hasMs bool, nowUnix int64) {
		clock := testutil.NewClock()
		if nowUnix != 0 {
			clock.Set(time.Unix(nowUnix, 0))
		}
		h := http.Header{}
		if hasRA {
			h["Retry-After"] = []string{ra}
		}
		if hasMs {
			h["Retry-After-Ms"] = []string{ms}
		}
		d, ok := retryAfter(h, clock)
		if ok != (hasRA || hasMs) {
			t.Fatalf("%v: seen %v", h, ok)
		}
		if d < 0 || d > 24*time.Hour {
			t.Fatalf("%v: %v", h, d)
		}
		if exact, valid := retryAfterMsRef(ms); hasMs && valid {
			// Within a nanosecond of the exact product.
			diff := new(big.Float).SetPrec(1000).Sub(new(big.Float).SetInt64(int64(d)), exact)
			if diff.Abs(diff).Cmp(big.NewFloat(1)) >= 0 {
				t.Fatalf("%v: %v, want %v ns", h, d, exact.Text('g', 30))
			}
			return
		}
		want := time.Duration(0)
		if hasRA {
			want = retryAfterRef(ra, clock.Now())
		}
		if d != want {
			t.Fatalf("%v at %v: %v, want %v", h, clock.Now(), d, want)
		}
	})
}
