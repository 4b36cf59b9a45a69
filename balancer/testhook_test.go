package balancer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/internal/testhook"
	"github.com/inferlb/inferlb/internal/testutil"
)

// The adapters' tests wait for a call's end, which grpc-go reports on a
// goroutine of its own, on testhook.SetOnDone instead of polling the
// stats on a timer: the hook must come once per call, after the counts
// include the call's end, and stop once removed.
func TestDoneHookComesOnceTheCountsIncludeTheCall(t *testing.T) {
	b := balancer.New(balancer.Options{Clock: testutil.NewClock()})
	const id = "10.0.0.1:8000"
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: id}}))
	var seen []balancer.EndpointStats
	testhook.SetOnDone(b, func(got string) {
		assert.Equal(t, id, got)
		seen = append(seen, stat(t, b, got))
	})

	p, err := b.Pick(&inferlb.Request{})
	require.NoError(t, err)
	p.Done(inferlb.Outcome{})
	p.Done(inferlb.Outcome{}) // no effect, no hook
	require.Len(t, seen, 1)
	assert.Zero(t, seen[0].InFlight, "the hook sees the call out of flight")
	assert.Equal(t, uint64(1), seen[0].Successes, "the hook sees the call counted")

	testhook.SetOnDone(b, nil)
	p, err = b.Pick(&inferlb.Request{})
	require.NoError(t, err)
	p.Done(inferlb.Outcome{})
	assert.Len(t, seen, 1, "a removed hook is not called")
}
