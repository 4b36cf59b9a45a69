package fleetsim_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/benchmarks/fleetsim"
)

// The simulator reports Outcome.Model as the adapters do: the call's model
// on a success and on a failure the replica answered (a 500 for a model
// that fails there, whether the call was waiting, streaming or new), never
// on one it could not answer (a stream its crash cut, a refused dial).
func TestOutcomeNamesTheModelOfCallsTheReplicaAnswered(t *testing.T) {
	fl := []fleetsim.ReplicaSpec{{Server: fleetsim.LLMServer()}, {Server: fleetsim.LLMServer()}}
	call := func() *fleetsim.Request {
		c := llmCall(1, 1000, 1000)
		c.Model = "lora-sql"
		return c
	}
	fail := fleetsim.FleetEvent{At: 5 * time.Second, Replica: 0, Kind: fleetsim.ModelFail, Model: "lora-sql"}

	// Streaming on r0 when its lora-sql fails: the stream ends with an
	// error the server sent, and the retry on r1 generates the answer anew;
	// the tokens r0 streamed are not throughput.
	rt := &scripted{script: []int{0, 1}, retry: true}
	res := runScripted(fl, calls{call()}, rt, fail)
	require.Equal(t, 1, res.Completed)
	require.Len(t, rt.outcomes, 2)
	require.Error(t, rt.outcomes[0].Err)
	assert.Equal(t, "lora-sql", rt.outcomes[0].Model, "a failure the server answered")
	assert.NoError(t, rt.outcomes[1].Err)
	assert.Equal(t, "lora-sql", rt.outcomes[1].Model, "a success")
	assert.InDelta(t, 1000, res.Throughput*time.Minute.Seconds(), 1e-6, "tokens of the answer delivered")
	require.NotNil(t, res.Broken)
	assert.Equal(t, []int{1, 1}, res.Broken.Attempts)
	assert.Equal(t, 1, res.Broken.Completed)
	assert.Equal(t, fleetsim.ModelResult{Attempts: []int{0, 0}}, *res.Healthy)

	// A new call for it there is answered 500 in milliseconds, with no
	// GPU work; another model's call is served.
	rt = &scripted{script: []int{0, 0}}
	other := llmCall(2, 1000, 100)
	other.Model = fleetsim.Model
	fail.At = 0
	res = runScripted(fl, calls{call(), other}, rt, fail)
	require.Len(t, rt.outcomes, 2)
	assert.Equal(t, "lora-sql", rt.outcomes[0].Model)
	require.Error(t, rt.outcomes[0].Err)
	assert.Equal(t, fleetsim.Model, rt.outcomes[1].Model)
	assert.NoError(t, rt.outcomes[1].Err)
	assert.Equal(t, 1, res.Broken.Failed)
	assert.Equal(t, 1, res.Healthy.Completed)

	// A crash cuts the stream: no answer, no model.
	rt = &scripted{script: []int{0, 1}, retry: true}
	res = runScripted(fl, calls{call()}, rt, fleetsim.FleetEvent{At: 5 * time.Second, Replica: 0, Kind: fleetsim.Crash})
	require.Equal(t, 1, res.Completed)
	require.Len(t, rt.outcomes, 2)
	require.Error(t, rt.outcomes[0].Err)
	assert.Empty(t, rt.outcomes[0].Model, "the endpoint's failure")
	assert.Equal(t, "lora-sql", rt.outcomes[1].Model)
	assert.Nil(t, res.Healthy, "no model fails in this run")
}
