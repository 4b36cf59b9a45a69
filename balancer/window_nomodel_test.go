package balancer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A call without a model (TEI's native /embed) is served by the server's
// one model: a refusal of such a call is remembered under a key of its
// own, which steers later calls without a model and no named model's,
// and a named model's window does not steer calls without one.
func TestContextWindowWithoutModel(t *testing.T) {
	b := newBalancer(t, 3, balancer.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(4)})
	small, other := endpoints(3)[0].Addr, endpoints(3)[1].Addr
	refuse(t, b, small, "", 512)
	refuse(t, b, other, "e5", 512)

	long := &inferlb.Request{Service: inferlb.ServiceEmbedding, PromptTokens: 2000, LongestInput: 600}
	got := picksOf(t, b, long, 300)
	assert.Zero(t, got[small], "an input of 600 tokens does not fit 512")
	assert.Greater(t, got[other], 60, "a named model's window says nothing of calls without one")
	short := &inferlb.Request{Service: inferlb.ServiceEmbedding, PromptTokens: 4000, LongestInput: 100}
	assert.Greater(t, picksOf(t, b, short, 300)[small], 60, "inputs of 100 tokens do")
	named := &inferlb.Request{Service: inferlb.ServiceEmbedding, Model: "bge", PromptTokens: 2000, LongestInput: 600}
	assert.Greater(t, picksOf(t, b, named, 300)[small], 60, "nor the window of calls without one a named model's")
	assert.EqualValues(t, 1, stat(t, b, small).TooLong)
}
