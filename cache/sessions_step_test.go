package cache_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/cache"
)

// The wall clock can step back (an NTP step, a VM restored from a
// snapshot), and the balancer's default clock follows it. An entry written
// before a step back of an hour expired an hour late: a sticky session
// held its endpoint, and a spill target counted as warm, for the length of
// the step; and as the least recently used entry is the one that expires
// first, such entries were evicted last, so every new session of a full
// set evicted the one written just before it. A step back shorter than the
// TTL (or a race between two clock readings) keeps entries.
func TestSessionsSurviveAClockStepBack(t *testing.T) {
	s, clock := newSessions(t, cache.SessionOptions{MaxEntries: 8, TTL: time.Minute})
	for k := uint64(1); k <= 8; k++ {
		s.Put(k, k*10)
	}
	clock.Advance(-30 * time.Second)
	for k := uint64(1); k <= 8; k++ {
		_, ok := s.Get(k)
		assert.True(t, ok, "a step back shorter than the TTL keeps key %d", k)
	}
	clock.Advance(-time.Hour)
	for k := uint64(1); k <= 8; k++ {
		_, ok := s.Get(k)
		assert.False(t, ok, "key %d was written an hour ahead of the clock", k)
	}
	assert.Zero(t, s.Len())
	for k := uint64(11); k <= 18; k++ {
		s.Put(k, k*10)
	}
	for k := uint64(11); k <= 18; k++ {
		v, ok := s.Get(k)
		require.True(t, ok, "key %d, written after the step", k)
		assert.Equal(t, k*10, v)
	}
}
