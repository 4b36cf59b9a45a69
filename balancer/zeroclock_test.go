package balancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A fake clock that starts at its zero value (time.Time{}, a hand-rolled
// test clock's natural start) reads as Unix nanoseconds far below zero.
// The saturating add behind every exclusion overflowed for a time before
// 1970 and saturated to the end of time: one overload answer, or one trip,
// held the endpoint out for good.
func TestExclusionsEndOnAClockFromTheZeroTime(t *testing.T) {
	clock := testutil.NewClock()
	clock.Set(time.Time{})
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(1), PanicThreshold: -1})
	require.NoError(t, b.Update(endpoints(2)))
	id := endpoints(2)[0].Key()
	s, _ := b.Serial(id)

	p, err := b.PickAt(&inferlb.Request{}, s)
	require.NoError(t, err)
	p.Done(inferlb.Outcome{Overloaded: true, RetryAfter: time.Second})
	assert.Equal(t, clock.Now().Add(time.Second).UnixNano(), stat(t, b, id).ExcludedUntil.UnixNano(), "cooling down for its Retry-After")

	clock.Advance(2 * time.Second)
	assert.True(t, stat(t, b, id).ExcludedUntil.IsZero(), "back after its Retry-After")
	p, err = b.PickAt(&inferlb.Request{}, s)
	require.NoError(t, err)
	assert.Equal(t, id, p.ID())
	p.Done(inferlb.Outcome{})

	for range balancer.DefaultBreakerFailures {
		p, err = b.PickAt(&inferlb.Request{}, s)
		require.NoError(t, err)
		p.Done(inferlb.Outcome{Err: errDown})
	}
	assert.Equal(t, clock.Now().Add(balancer.DefaultEjectionTime).UnixNano(), stat(t, b, id).ExcludedUntil.UnixNano(), "tripped for EjectionTime")
}
