package fleetsim

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/inferlb/inferlb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// shortHung is the hung scenario cut to run in a second: r0 hangs at 40 s
// and is restarted at 150 s, the window is 20-150 s.
func shortHung() *Scenario {
	sc := Lookup("hung")
	if sc == nil {
		panic("no hung scenario")
	}
	sc.Warmup, sc.Duration, sc.Drain = 20*time.Second, 150*time.Second, 40*time.Second
	sc.Events = []FleetEvent{
		{At: 40 * time.Second, Replica: HungReplica, Kind: Hang},
		{At: 150 * time.Second, Replica: HungReplica, Kind: Crash},
		{At: 150 * time.Second, Replica: HungReplica, Kind: Restart},
	}
	return sc
}

func runHung(sc *Scenario, pol Policy, seed uint64) Result {
	return Run(sc, pol, RunConfig{Rate: sc.Rates[0], Seed: seed,
		Warmup: sc.Warmup, Duration: sc.Duration, Drain: sc.Drain, Scrape: sc.Scrape})
}

// ending is one call's end as its router heard it.
type ending struct {
	replica int
	picked  time.Duration
	o       inferlb.Outcome
}

// recordEndings wraps pol's routers so that every call's end is appended
// to *out with its replica and the simulated time of its pick.
func recordEndings(pol Policy, out *[]ending) Policy {
	build := pol.New
	pol.New = func(e Env) Router {
		return &endingRecorder{Router: build(e), clock: e.Clock, out: out}
	}
	return pol
}

type endingRecorder struct {
	Router
	clock Clock
	out   *[]ending
}

func (r *endingRecorder) Pick(req *Request) (int, func(inferlb.Outcome), error) {
	idx, done, err := r.Router.Pick(req)
	if err != nil {
		return idx, done, err
	}
	at := r.clock.Now().Sub(Epoch)
	return idx, func(o inferlb.Outcome) {
		*r.out = append(*r.out, ending{replica: idx, picked: at, o: o})
		done(o)
	}, nil
}

// Once r0 hangs, it answers nothing: every call round-robin sends it
// until its restart ends without a success; each its caller gave up on
// (30 s later) is context.Canceled with Outcome.Unanswered, as nothing
// came back; those younger than 30 s at the restart fail with it. Calls
// picked before the hang on r0, and the other replicas' calls, succeed.
func TestHungReplicaAnswersNothing(t *testing.T) {
	t.Parallel()
	sc := shortHung()
	var ends []ending
	res := runHung(sc, recordEndings(RoundRobin(), &ends), 1)
	hang, restart := sc.Events[0].At, sc.Events[1].At
	var toHung, abandoned, othersOK, beforeOK int
	for _, e := range ends {
		switch {
		case e.replica == HungReplica && e.picked >= hang && e.picked < restart:
			toHung++
			assert.Error(t, e.o.Err, "a call picked on the hung replica at %v succeeded", e.picked)
			if errors.Is(e.o.Err, context.Canceled) {
				abandoned++
				assert.True(t, e.o.Unanswered, "abandoned at %v with nothing back", e.picked)
			} else {
				assert.ErrorIs(t, e.o.Err, errCrashed)
				assert.Greater(t, e.picked, restart-sc.ClientTimeout, "only calls younger than the timeout meet the restart")
			}
		case e.replica == HungReplica && e.picked < hang-sc.ClientTimeout:
			if e.o.Err == nil {
				beforeOK++
			}
		case e.replica != HungReplica && e.o.Err == nil:
			othersOK++
		}
	}
	assert.Greater(t, toHung, 100, "round-robin sends the hung replica an eighth of the calls")
	assert.Greater(t, abandoned, 100)
	assert.Positive(t, beforeOK, "r0 answered before the hang")
	assert.Greater(t, othersOK, 1000)
	assert.Positive(t, res.Abandoned)
	assert.LessOrEqual(t, res.Abandoned, res.Failed)
}

// inferlb, reading Outcome.Unanswered, abandons fewer calls on the hung
// replica than the same balancer without it, with and without affinity,
// on every seed tried; and more tokens get through.
func TestHungInferLBAbandonsFewerWithUnanswered(t *testing.T) {
	t.Parallel()
	sc := shortHung()
	for _, seed := range []uint64{1, 2} {
		for _, pair := range [][2]Variant{
			{{Name: "inferlb"}, {Name: "inferlb no-unanswered", NoUnanswered: true}},
			{{Name: "inferlb -affinity", Options: affinityOff}, {Name: "inferlb -affinity no-unanswered", Options: affinityOff, NoUnanswered: true}},
		} {
			with, without := runHung(sc, InferLB(pair[0]), seed), runHung(sc, InferLB(pair[1]), seed)
			require.Positive(t, without.Abandoned, "seed %d, %s", seed, pair[1].Name)
			assert.Less(t, with.Abandoned, without.Abandoned, "seed %d, %s vs %s", seed, pair[0].Name, pair[1].Name)
			t.Logf("seed %d: %s abandoned %d (%.0f tok/s), %s %d (%.0f tok/s)", seed,
				pair[0].Name, with.Abandoned, with.Throughput, pair[1].Name, without.Abandoned, without.Throughput)
		}
	}
}
