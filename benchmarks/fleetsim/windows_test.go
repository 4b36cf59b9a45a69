package fleetsim_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/benchmarks/fleetsim"
)

// windowFleet is small replicas (an 8,192-token window) and then one
// large (32,768), all otherwise alike.
func windowFleet(small int) []fleetsim.ReplicaSpec {
	fl := make([]fleetsim.ReplicaSpec, small+1)
	for i := range fl {
		fl[i] = fleetsim.ReplicaSpec{Server: fleetsim.LLMServer(), Speed: 1}
		fl[i].Server.MaxModelLen = fleetsim.SmallWindow
	}
	fl[small].Server.MaxModelLen = fleetsim.LargeWindow
	return fl
}

// A replica refuses a call whose prompt and max_tokens together exceed its
// window, within milliseconds and with no GPU work; a call that fills the
// window exactly is served, and a replica without a window serves any.
func TestReplicaRefusesCallsLongerThanItsWindow(t *testing.T) {
	fl := windowFleet(1)
	fl = append(fl, fleetsim.ReplicaSpec{Server: fleetsim.LLMServer(), Speed: 1}) // no window

	fits := llmCall(1, fleetsim.SmallWindow-100, 100)
	rt := &scripted{script: []int{0}}
	res := runScripted(fl, calls{fits}, rt)
	require.Equal(t, 1, res.Completed, "prompt + max_tokens == window fits")
	assert.Zero(t, res.TooLong)
	require.Len(t, rt.outcomes, 1)
	assert.Zero(t, rt.outcomes[0].ContextWindow)

	over := llmCall(2, fleetsim.SmallWindow-100, 100)
	over.MaxOutputTokens = 101 // the client asks for one token more than fits
	over.Model = fleetsim.Model
	rt = &scripted{script: []int{0}}
	res = runScripted(fl, calls{over}, rt)
	assert.Equal(t, 1, res.Failed, "a router that does not retry hands the caller the 400")
	assert.Equal(t, 1, res.TooLong)
	assert.Zero(t, res.GPUBusy, "refused before any work")
	require.Len(t, rt.outcomes, 1)
	assert.Equal(t, fleetsim.SmallWindow, rt.outcomes[0].ContextWindow)
	assert.Equal(t, fleetsim.Model, rt.outcomes[0].Model, "an answer of the replica's names the model")
	assert.NoError(t, rt.outcomes[0].Err, "a refusal is neither success nor failure")

	// The baselines' single retry: on the large replica it is served, and
	// on a replica without a window too; the refusal cost milliseconds.
	for _, to := range []int{1, 2} {
		rt = &scripted{script: []int{0, to}, retry: true}
		res = runScripted(fl, calls{llmCall(3, 20000, 500)}, rt)
		require.Equal(t, 1, res.Completed, "retried on r%d", to)
		assert.Equal(t, 1, res.TooLong)
		assert.Equal(t, 1, res.Retries)
	}
	rt = &scripted{script: []int{0, 0}, retry: true}
	res = runScripted(fl, calls{llmCall(3, 20000, 500)}, rt)
	assert.Equal(t, 1, res.Failed, "refused again on retry")
	assert.Equal(t, 2, res.TooLong)
}

// inferlb's real Balancer, reading the refusal as the HTTP transport does,
// sends every long call on to the one large replica: none fails, and the
// Balancer remembers each small window, so the fleet refuses each small
// replica's window at most once (the calls come a second apart: sent all
// at once, each would be picked before any refusal came back). Read as a
// failure with one retry, long calls fail.
func TestInferLBRetryReachesTheLargeReplica(t *testing.T) {
	fl := windowFleet(3)
	var long spaced
	for i := range 40 {
		long = append(long, llmCall(uint64(10+i), 12000+100*i, 300))
	}
	for i := range long {
		long[i].Model = fleetsim.Model
	}
	sc := &fleetsim.Scenario{Name: "windows", Fleet: fl, DiscoveryDelay: 10 * time.Second,
		Workload: func(float64) fleetsim.Workload { return long }}
	conf := fleetsim.RunConfig{Rate: 1, Seed: 1, Duration: time.Minute, Drain: 5 * time.Minute, Scrape: time.Second}

	res := fleetsim.Run(sc, fleetsim.InferLB(fleetsim.Variant{Name: "inferlb"}), conf)
	assert.Equal(t, len(long), res.Completed)
	assert.Zero(t, res.Failed)
	assert.Positive(t, res.TooLong, "the calls met small replicas before the Balancer knew")
	assert.LessOrEqual(t, res.TooLong, 3, "each small replica refuses once; then it is remembered")
	assert.Equal(t, res.TooLong, res.Retries, "every refusal went on, no failover retry")

	res = fleetsim.Run(sc, fleetsim.InferLB(fleetsim.Variant{Name: "inferlb no-window", NoWindow: true}), conf)
	assert.Positive(t, res.Failed, "one retry does not find the large replica for every call")
	assert.Greater(t, res.TooLong, 3)
}

// The context-windows scenario gives the same Result for the same seed, and
// the figures its table reports hold: inferlb fails no call, the
// baselines fail some, refusals are counted.
func TestContextWindowsScenarioIsDeterministic(t *testing.T) {
	t.Parallel()
	sc := fleetsim.Lookup("context-windows")
	require.NotNil(t, sc)
	q := sc.Quick()
	conf := fleetsim.RunConfig{Rate: q.Headline, Clients: 1, Seed: 3, Warmup: q.Warmup, Duration: q.Duration, Drain: q.Drain, Scrape: q.Scrape}
	pol := func(name string) fleetsim.Policy {
		for _, p := range q.Policies {
			if p.Name == name {
				return p
			}
		}
		t.Fatalf("no policy %q", name)
		return fleetsim.Policy{}
	}
	a := fleetsim.Run(q, pol("inferlb"), conf)
	b := fleetsim.Run(q, pol("inferlb"), conf)
	assert.Equal(t, a, b)
	assert.Zero(t, a.Failed)
	assert.Positive(t, a.Completed)

	rr := fleetsim.Run(q, pol("round-robin"), conf)
	assert.Equal(t, rr, fleetsim.Run(q, pol("round-robin"), conf))
	assert.Positive(t, rr.Failed)
	assert.Greater(t, rr.TooLong, rr.Failed, "a failed long call met two refusals, a served one at most one")
}

// spaced submits its calls a second apart, so that each is picked after
// the refusals of those before it were reported (calls submits them all
// at once, before any answer).
type spaced []*fleetsim.Request

func (c spaced) Start(s fleetsim.Sim) {
	for i, r := range c {
		s.After(time.Duration(i+1)*time.Second, func() { s.Submit(r) })
	}
}

func (spaced) Done(fleetsim.Sim, *fleetsim.Request, bool) {}
