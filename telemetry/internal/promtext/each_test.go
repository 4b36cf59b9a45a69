package promtext_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb/telemetry/internal/promtext"
)

// Scrapes that hang until their context ends: each one with par or more
// targets still to start after it gets half the time left, and the last
// par get the rest, so every target starts before the round's deadline.
func TestEachLeavesTimeForTheQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), 16*time.Second)
		defer cancel()
		began := make([]time.Duration, 5)
		ended := make([]time.Duration, 5)
		promtext.Each(ctx, 5, 2, func(ctx context.Context, i int) {
			began[i] = time.Since(start)
			<-ctx.Done()
			ended[i] = time.Since(start)
		})
		s := time.Second
		assert.Equal(t, []time.Duration{0, 0, 8 * s, 8 * s, 12 * s}, began)
		assert.Equal(t, []time.Duration{8 * s, 8 * s, 12 * s, 16 * s, 16 * s}, ended)
	})

	// Without a deadline, the caller's context alone.
	var ran atomic.Int64
	promtext.Each(context.Background(), 3, 8, func(ctx context.Context, i int) {
		_, ok := ctx.Deadline()
		assert.False(t, ok)
		ran.Add(1)
	})
	assert.Equal(t, int64(3), ran.Load())
}
