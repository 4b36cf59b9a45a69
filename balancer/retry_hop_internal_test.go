package balancer

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// Hops past "not served" answers (withdraw with hop) never take the last
// retry: once they are denied, a failover is still allowed, from the
// bucket or the floor, over the whole range of options (RetryRatio is at
// most 1, negative ones are 0; RetryFloor any finite value, negative ones
// 0), clocks before 1970 included.
func TestRetryHopsLeaveFailoverARetry(t *testing.T) {
	t.Parallel()
	for _, ratio := range []float64{0, 0.001, 0.01, 0.015, 0.0199, 0.02, 0.03, 0.2, 1} {
		for _, floor := range []float64{0, 1e-300, 0.05, 0.1, 0.15, 0.2, 0.25, 1, 10, 1e3, 1e9, 1e12, 1e300} {
			for _, nowNs := range []int64{0, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano(), time.Time{}.UnixNano(), math.MinInt64 / 2, math.MaxInt64 / 2} {
				t.Run(fmt.Sprint(ratio, "/", floor, "/", nowNs), func(t *testing.T) {
					if ratio == 0 && floor == 0 {
						return // no retry ever
					}
					rb := newRetryBudget(ratio, floor)
					for range int(2 * retryCapacityRequests / max(ratio, 0.01)) {
						rb.deposit()
					}
					hops := 0
					for hops < 100_000 && rb.withdraw(nowNs, true) {
						hops++
					}
					if hops == 100_000 {
						return // a floor this high allows any number
					}
					// the reserve: hops stop while failover goes on
					assert.True(t, rb.withdraw(nowNs, false), "a failover after %d hops", hops)
					assert.False(t, rb.withdraw(nowNs, true), "a hop after the failover")
				})
			}
		}
	}
}

// The same with the bucket's cap soft: a deposit that passed the cap,
// not yet clamped (a race of two deposits and a retry), must not let a
// hop take what failover has left.
func TestRetryHopBeforeAClampLeavesFailoverARetry(t *testing.T) {
	for _, ratio := range []float64{0.0199, 0.02, 0.2, 1} {
		rb := newRetryBudget(ratio, 0)
		for below := int64(1); below < rb.ratioMicro; below += rb.ratioMicro / 64 {
			rb.tokens.Store(rb.capMicro - below)
			rb.tokens.Add(rb.ratioMicro) // past the cap, before its clamp
			hops := 0
			for rb.withdraw(0, true) {
				hops++
			}
			if !assert.True(t, rb.withdraw(0, false), "RetryRatio %v, %d below the cap: a failover after %d hops", ratio, below, hops) {
				break
			}
		}
	}
}
