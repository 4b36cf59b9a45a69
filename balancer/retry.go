package balancer

import (
	"math"
	"sync/atomic"
	"time"
)

// Retry budget defaults, after Finagle's and Linkerd's retry budgets: retries
// may add at most 20% to the traffic, plus a floor of 10 per second so a
// quiet client can still fail over.
const (
	DefaultRetryRatio     = 0.2
	DefaultRetryFloor     = 10 // retries per second always allowed
	retryCapacityRequests = 100
	// retryReserve is how much of the floor's allowance a quiet spell
	// banks: a replica that crashes fails all the calls it was streaming
	// at once, and at the default floor the bank (100 retries) lets such a
	// burst fail over whole where one second's (10) failed most of it on a
	// healthy fleet. Sustained retries still come at the floor's rate plus
	// RetryRatio of the traffic.
	retryReserve = 10 * time.Second
)

// retryBudget is a token bucket in micro-tokens: every call's first pick
// deposits ratio*1e6 (capped; failover picks deposit nothing), every retry
// withdraws 1e6 (in milli-tokens a RetryRatio under 0.001 earned nothing).
// A second bucket refills at floor retries per second from the clock.
// Lock-free.
type retryBudget struct {
	ratioMicro int64 // deposit per request
	capMicro   int64
	floor      float64
	tokens     atomic.Int64 // micro-tokens from traffic
	// Unix ns up to which floor tokens were spent; math.MinInt64 before
	// the first, not 0: a clock that reads before 1970 (a fake one from
	// the zero Time) reads below 0, and a mark ahead of the clock is read
	// as a clock stepped back, which restarts the floor with one retry's
	// allowance instead of the bank.
	floorAt atomic.Int64
}

// oneRetry is what a retry costs, in micro-tokens.
const oneRetry = 1_000_000

func newRetryBudget(ratio, floor float64) *retryBudget {
	rb := &retryBudget{ratioMicro: int64(ratio * oneRetry), floor: floor}
	rb.capMicro = max(int64(float64(retryCapacityRequests)*ratio*oneRetry), oneRetry)
	rb.floorAt.Store(math.MinInt64)
	return rb
}

func (rb *retryBudget) deposit() {
	if rb.ratioMicro <= 0 || rb.tokens.Load() >= rb.capMicro {
		// Full (the steady state with few retries): a read leaves the
		// shared cache line alone, where an add would bounce it between
		// cores on every pick.
		return
	}
	if v := rb.tokens.Add(rb.ratioMicro); v > rb.capMicro {
		rb.clamp(v)
	}
}

// clamp brings the bucket back to its cap after a deposit left it at v. A
// compare-and-swap, not a store: a retry withdrawn between the deposit and
// the clamp stays withdrawn (a store would refund it). If the swap loses,
// the bucket stays above the cap by less than a deposit or two, which the
// next deposit's check sees: the cap is soft.
func (rb *retryBudget) clamp(v int64) {
	rb.tokens.CompareAndSwap(v, rb.capMicro)
}

// withdraw spends a retry if the budget allows it. A hop (a retry past a
// "not served" answer, see PickNotServedRetry) draws the budget only down
// to a reserve kept for failover: half the traffic bucket's cap and half
// the floor's bank. Made-up model names, which no endpoint serves, send
// each call round the fleet; without the reserve a flood of them spent
// the whole budget, and a replica dying then failed its calls with no
// retry for some 10 s.
func (rb *retryBudget) withdraw(nowNs int64, hop bool) bool {
	var keep int64 // micro-tokens left to failover
	if hop {
		// At least one retry: under a cap of two, half of it is less,
		// and the cap is soft (clamp), so a hop could take all but part
		// of a retry.
		keep = max(rb.capMicro/2, oneRetry)
	}
	for {
		t := rb.tokens.Load()
		if t < oneRetry+keep {
			break
		}
		if rb.tokens.CompareAndSwap(t, t-oneRetry) {
			return true
		}
	}
	if rb.floor <= 0 {
		return false
	}
	// The floor: one retry per 1/floor seconds, with up to retryReserve of
	// unused allowance banked (the reserve of Finagle's budget, its
	// minRetriesPerSec x ttl), or one retry's when that is longer: banking
	// less than one retry, a floor under one a second allowed none.
	// In float, bounded before converting: a floor so small that its
	// period overflows int64 would otherwise wrap into "always allowed".
	step := int64(min(float64(time.Second)/rb.floor, math.MaxInt64/4))
	bank := max(step, int64(retryReserve))
	var kept int64 // of the bank, left to failover
	if hop {
		kept = bank / 2
	}
	for {
		at := rb.floorAt.Load()
		from := at
		if at > nowNs {
			// Only a clock stepped back puts the mark ahead of it: as it
			// stood, the floor would allow nothing for the length of the
			// step. Restart it with one retry's allowance.
			from = nowNs - step
		}
		next := max(from, nowNs-bank) + step
		if next > nowNs-kept {
			return false
		}
		if rb.floorAt.CompareAndSwap(at, next) {
			return true
		}
	}
}

// AllowRetry reports whether one more retry fits the retry budget and, if
// so, spends it. Adapters fail a call over to another endpoint only when it
// allows, so retries cannot storm a degraded fleet: they add at most
// RetryRatio of the traffic (default 20%) plus RetryFloor per second.
// PickRetry calls it once it has found an endpoint for the retry; an
// adapter that calls it itself before picking spends a retry also when
// the pick then finds nowhere to go.
func (b *Balancer) AllowRetry() bool {
	return b.allowRetry(false)
}

// allowRetry is AllowRetry; hop says the retry is a hop past a "not
// served" answer, which leaves failover a reserve (withdraw).
func (b *Balancer) allowRetry(hop bool) bool {
	ok := b.retry.withdraw(b.cfg.nowNs(), hop)
	if ok {
		b.retries.Add(1)
	} else {
		b.retriesDenied.Add(1)
	}
	return ok
}

// RetryStats counts AllowRetry answers.
type RetryStats struct {
	Allowed, Denied uint64
}

// RetryStats returns how many retries were allowed and denied.
func (b *Balancer) RetryStats() RetryStats {
	return RetryStats{Allowed: b.retries.Load(), Denied: b.retriesDenied.Load()}
}
