package httpbalancer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

// TestNewTransportRefusesAClosedBalancer: a Balancer already closed is
// refused whether or not the Transport lists endpoints. Without Endpoints
// it was taken, and every call through the Transport then failed with
// ErrClosed; with them NewTransport already refused it.
func TestNewTransportRefusesAClosedBalancer(t *testing.T) {
	b := balancer.New(balancer.Options{})
	b.Close()
	for _, o := range []httpbalancer.Options{
		{Balancer: b},
		{Balancer: b, Endpoints: []inferlb.Endpoint{{Addr: "10.0.0.1:8000"}}},
		{Balancer: b, Endpoints: []inferlb.Endpoint{}},
	} {
		tr, err := httpbalancer.NewTransport(o)
		require.Error(t, err, "%+v", o)
		assert.Nil(t, tr)
		assert.ErrorIs(t, err, balancer.ErrClosed)
		assert.Contains(t, err.Error(), "inferlb: httpbalancer.Options.Balancer")
	}
}
