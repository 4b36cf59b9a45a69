package httpbalancer

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
)

// TestCallStateKeepsItsSizeClass guards the one allocation per call (see
// call): 640 bytes is a size class of Go's allocator, and the next is 704.
// A field added to call, or to balancer.Pick inside it, that crosses it
// costs every call 64 bytes more (BenchmarkTransportOverhead's B/op).
func TestCallStateKeepsItsSizeClass(t *testing.T) {
	assert.LessOrEqual(t, int(callHeader), 640, "call with its allocation header")
}

// A call picked just before an Update that drops its endpoint from this
// Transport reaches outgoing after it; on a shared Balancer it must still
// go to this Transport's address for the ID, not to the one another
// adapter gave the Balancer (a gRPC port).
func TestCallPickedBeforeAnUpdateKeepsItsAddress(t *testing.T) {
	b := balancer.New(balancer.Options{})
	tr, err := NewTransport(Options{Balancer: b, Endpoints: []inferlb.Endpoint{
		{ID: "r0", Addr: "10.0.0.1:8000"}, {ID: "r1", Addr: "10.0.0.2:8000"}}})
	require.NoError(t, err)
	defer tr.Close()
	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "r1", Addr: "10.0.0.2:8001"}})) // the other adapter's port

	c := &call{t: tr}
	for range 1000 {
		if c.pick, err = tr.mem.Pick(&inferlb.Request{}); err == nil && c.pick.ID() == "r1" {
			break
		}
		c.pick.Done(inferlb.Outcome{})
	}
	require.Equal(t, "r1", c.pick.ID())
	require.NoError(t, tr.Update([]inferlb.Endpoint{{ID: "r0", Addr: "10.0.0.1:8000"}})) // r1 leaves this Transport

	r := httptest.NewRequest(http.MethodPost, "http://llm.internal/v1/chat/completions", nil)
	c.out = *r
	out, err := c.outgoing(r, bodyReader{}, nil, true)
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.2:8000", out.URL.Host)
	c.pick.Done(inferlb.Outcome{})
}
