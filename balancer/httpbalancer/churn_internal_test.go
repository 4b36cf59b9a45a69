package httpbalancer

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A Transport on a shared Balancer keeps its own address per endpoint ID
// (own), and the addresses of the endpoints that just left, for calls
// picked before the update. Pods replaced thousands of times must leave
// it holding the current set and the last one only; and closing the
// Transport takes its endpoints out of the Balancer.
func TestOwnAddressesHoldTheCurrentAndLastSetOnly(t *testing.T) {
	b := balancer.New(balancer.Options{Clock: testutil.NewClock()})
	tr, err := NewTransport(Options{Balancer: b, Base: http.DefaultTransport,
		Endpoints: []inferlb.Endpoint{{ID: "stays", Addr: "10.255.0.1:8000"}}})
	require.NoError(t, err)
	const rounds, size = 10_000, 3
	for r := range rounds {
		eps := []inferlb.Endpoint{{ID: "stays", Addr: "10.255.0.1:8000"}}
		for i := 1; i < size; i++ {
			eps = append(eps, inferlb.Endpoint{ID: fmt.Sprintf("pod-%d-%d", r, i), Addr: fmt.Sprintf("10.%d.%d.%d:8000", r>>8&255, r&255, i)})
		}
		require.NoError(t, tr.Update(eps))
		if n := len(*tr.own.Load()); n > 2*size-1 {
			t.Fatalf("round %d: %d own addresses for %d endpoints", r, n, size)
		}
	}
	require.Len(t, b.Stats(), size)
	require.NoError(t, tr.Close())
	require.Empty(t, b.Stats(), "the closed Transport's endpoints left the Balancer")
}
