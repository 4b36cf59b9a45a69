package fleetsim

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/inferlb/inferlb"
)

// connAware gives a baseline router what grpc-go's pickfirst children give
// its policies: a replica whose connection broke or was refused leaves the
// rotation (TRANSIENT_FAILURE) and is tried again by a connection attempt,
// not a call, after a backoff of 1s doubling to 120s (grpc-go's default);
// it is back once the attempt finds it up. The baselines of the scenarios
// keep no connection state: a dead replica has nothing in flight, so
// least-request prefers it, and consistent hashing retries its owner.
type connAware struct {
	Router
	env     Env
	members []int
	until   []time.Duration // 0: in rotation
	backoff []time.Duration
}

func withConnState(p Policy) Policy {
	return Policy{Name: p.Name + " +conn", New: func(e Env) Router {
		return &connAware{Router: p.New(e), env: e,
			until: make([]time.Duration, len(e.IDs)), backoff: make([]time.Duration, len(e.IDs))}
	}}
}

func (c *connAware) SetMembers(m []int) {
	c.members = append(c.members[:0], m...)
	c.apply()
}

func (c *connAware) apply() {
	var in []int
	for _, i := range c.members {
		if c.until[i] == 0 {
			in = append(in, i)
		}
	}
	c.Router.SetMembers(in)
}

func (c *connAware) Pick(req *Request) (int, func(inferlb.Outcome), error) {
	now, changed := c.env.run.now, false
	for i, u := range c.until {
		if u == 0 || u > now {
			continue
		}
		if c.env.run.reps[i].up { // the connection attempt succeeds
			c.until[i], c.backoff[i], changed = 0, 0, true
		} else {
			c.backoff[i] = min(2*c.backoff[i], 120*time.Second)
			c.until[i] = now + c.backoff[i]
		}
	}
	if changed {
		c.apply()
	}
	i, done, err := c.Router.Pick(req)
	if err != nil {
		return i, done, err
	}
	return i, func(o inferlb.Outcome) {
		done(o)
		if (errors.Is(o.Err, errRefused) || errors.Is(o.Err, errCrashed)) && c.until[i] == 0 {
			c.backoff[i] = time.Second
			c.until[i] = c.env.run.now + c.backoff[i]
			c.apply()
		}
	}, nil
}

// TestFailuresWithConnectionStateWhatIf runs the failures scenario's
// baselines with and without connection state (connAware) beside inferlb.
// It runs only when asked:
//
//	FLEETSIM_WHATIF=1 go test -run TestFailuresWithConnectionStateWhatIf -v ./benchmarks/fleetsim/
func TestFailuresWithConnectionStateWhatIf(t *testing.T) {
	if os.Getenv("FLEETSIM_WHATIF") == "" {
		t.Skip("set FLEETSIM_WHATIF=1: a few minutes of simulation")
	}
	sc := FailuresScenario()
	var pols []Policy
	for _, p := range []Policy{RoundRobin(), Random(), LeastRequest(), RingHash()} {
		pols = append(pols, p, withConnState(p))
	}
	pols = append(pols, InferLB(Variant{Name: "inferlb"}))
	fmt.Printf("failures at %g req/s\n%-24s %4s %6s %7s %8s %8s %8s\n", sc.Headline, "policy", "seed", "tok/s", "failed", "TTFT p99", "E2E p50", "p99")
	for _, p := range pols {
		for seed := uint64(1); seed <= 3; seed++ {
			r := Run(sc, p, RunConfig{Rate: sc.Headline, Clients: 1, Seed: seed,
				Warmup: sc.Warmup, Duration: sc.Duration, Drain: sc.Drain, Scrape: sc.Scrape})
			fmt.Printf("%-24s %4d %6.0f %7d %7.2fs %7.2fs %7.2fs\n", p.Name, seed, r.Throughput, r.Failed, r.TTFTP99, r.E2EP50, r.E2EP99)
		}
	}
}
