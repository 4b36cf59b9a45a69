package grpcbalancer

import (
	"math"
	"math/big"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
)

// pushbackRef is retryAfter's model, in exact arithmetic: the first
// grpc-retry-pushback-ms value that is a positive integer (any size) in
// milliseconds, else the first retry-after value that is a positive
// number of seconds (strconv's syntax), saturated at the largest
// Duration; 0 for none. exact reports that the answer needs no rounding
// (an integer pushback).
func pushbackRef(md metadata.MD) (d *big.Float, exact bool) {
	if v := md["grpc-retry-pushback-ms"]; len(v) > 0 {
		if ms, ok := new(big.Int).SetString(strings.TrimSpace(v[0]), 10); ok && ms.Sign() > 0 {
			return new(big.Float).SetInt(ms.Mul(ms, big.NewInt(int64(time.Millisecond)))), true
		}
	}
	if v := md["retry-after"]; len(v) > 0 {
		s, err := strconv.ParseFloat(strings.TrimSpace(v[0]), 64)
		if (err == nil || s > 0) && s > 0 {
			if math.IsInf(s, 1) {
				return big.NewFloat(math.MaxInt64), true
			}
			return new(big.Float).Mul(big.NewFloat(s), big.NewFloat(float64(time.Second))), false
		}
	}
	return new(big.Float), true
}

// FuzzRetryAfter: a server's pushback, whatever it says, gives a
// cooldown that is never negative (a negative one would read as none, or
// wrap in the core) and agrees with the exact reading, saturated at the
// largest Duration.
func FuzzRetryAfter(f *testing.F) {
	for _, s := range [][2]string{
		{"1500", ""}, {"-1", "2"}, {"", "2.5"}, {"99999999999999999999", ""},
		{"9300000000000", ""}, {"", "1e400"}, {"", "9223372036.854775"}, {" 7 ", "x"},
		{"", "0x1p-3"}, {"", "Inf"}, {"", "NaN"}, {"+5", ""}, {"", "1e-12"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pushback, after string) {
		md := metadata.MD{}
		if pushback != "" {
			md["grpc-retry-pushback-ms"] = []string{pushback}
		}
		if after != "" {
			md["retry-after"] = []string{after}
		}
		got := retryAfter(md)
		if got < 0 {
			t.Fatalf("retryAfter(%v) = %v: negative", md, got)
		}
		ref, exact := pushbackRef(md)
		max := big.NewFloat(math.MaxInt64)
		if ref.Cmp(max) >= 0 {
			if got != math.MaxInt64 {
				t.Fatalf("retryAfter(%v) = %v, want the largest Duration", md, int64(got))
			}
			return
		}
		want, _ := ref.Int64() // truncated toward zero, as the conversion does
		if exact {
			if int64(got) != want {
				t.Fatalf("retryAfter(%v) = %d ns, want %d", md, int64(got), want)
			}
			return
		}
		// s*1e9 rounds once in float64: within a part in 2^52, and
		// saturated where the rounding reaches the largest Duration.
		diff := math.Abs(float64(got) - float64(want))
		if diff > 1+float64(want)/(1<<52) && got != math.MaxInt64 {
			t.Fatalf("retryAfter(%v) = %d ns, want about %d", md, int64(got), want)
		}
	})
}
