package balancer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
)

// A call for a model that no endpoint lists (a typo, an embedding model
// sent to the LLM fleet) fails with ErrModelNotListed, which waiting will
// not mend; one for a listed model whose endpoints are all out of rotation
// fails with plain ErrNoEndpoints. Both were the same ErrNoEndpoints, and
// the adapters' messages could only say "no endpoint serves it, or each
// that does is out of rotation".
func TestPickOfAModelNoEndpointListsSaysSo(t *testing.T) {
	llama := map[string]string{"model": "llama"}
	b := balancer.New(balancer.Options{PanicThreshold: -1})
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a:8000", Labels: llama}, {Addr: "b:8000", Labels: llama}}))

	_, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "gpt-4"})
	require.ErrorIs(t, err, balancer.ErrModelNotListed)
	require.ErrorIs(t, err, balancer.ErrNoEndpoints)
	_, err = b.PickAt(&inferlb.Request{Model: "gpt-4"}, 1)
	require.ErrorIs(t, err, balancer.ErrModelNotListed, "PickAt falls back to Pick")

	// Listed, every endpoint of it out of rotation: no ErrModelNotListed.
	b.SetReady("a:8000", false)
	b.SetReady("b:8000", false)
	_, err = b.Pick(&inferlb.Request{Model: "llama"})
	require.ErrorIs(t, err, balancer.ErrNoEndpoints)
	assert.NotErrorIs(t, err, balancer.ErrModelNotListed)
	_, err = b.Pick(&inferlb.Request{Model: "gpt-4"})
	assert.ErrorIs(t, err, balancer.ErrModelNotListed, "readiness does not change what is listed")

	// An unlabelled endpoint takes any model: nothing is unlisted.
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a:8000", Labels: llama}, {Addr: "any:8000"}}))
	p, err := b.Pick(&inferlb.Request{Model: "gpt-4"})
	require.NoError(t, err)
	assert.Equal(t, "any:8000", p.ID())
	p.Done(inferlb.Outcome{})

	// Without model labels every endpoint takes every model.
	plain := balancer.New(balancer.Options{})
	require.NoError(t, plain.Update([]inferlb.Endpoint{{Addr: "a:8000"}}))
	p, err = plain.Pick(&inferlb.Request{Model: "gpt-4"})
	require.NoError(t, err)
	p.Done(inferlb.Outcome{})

	// No endpoints at all, and a closed Balancer, say so, not the model.
	empty := balancer.New(balancer.Options{})
	_, err = empty.Pick(&inferlb.Request{Model: "gpt-4"})
	require.ErrorIs(t, err, balancer.ErrNoEndpoints)
	assert.NotErrorIs(t, err, balancer.ErrModelNotListed)
	b.Close()
	_, err = b.Pick(&inferlb.Request{Model: "gpt-4"})
	assert.ErrorIs(t, err, balancer.ErrClosed)
}
