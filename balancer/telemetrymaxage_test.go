package balancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb/balancer"
)

// An adapter sharing a Balancer (grpcbalancer.NewBuilder) checks its
// report interval against the age past which the Balancer ignores a
// reading; it sees the value in force, default applied, and 0 for a
// Balancer that never ignores one.
func TestTelemetryMaxAge(t *testing.T) {
	for _, tt := range []struct {
		set, want time.Duration
	}{
		{0, balancer.DefaultTelemetryMaxAge},
		{45 * time.Second, 45 * time.Second},
		{-1, 0},
	} {
		b := balancer.New(balancer.Options{TelemetryMaxAge: tt.set})
		assert.Equal(t, tt.want, b.TelemetryMaxAge(), "Options.TelemetryMaxAge %v", tt.set)
		b.Close()
	}
}
