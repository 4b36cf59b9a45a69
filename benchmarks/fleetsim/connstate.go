package fleetsim

import (
	"errors"
	"time"

	"github.com/inferlb/inferlb"
)

// WithConnState gives a baseline policy what grpc-go's pickfirst children
// give its own policies (round_robin, least_request, ring_hash): a replica
// whose connection broke or was refused leaves the rotation
// (TRANSIENT_FAILURE) and is tried again by a connection attempt, not a
// call, after a backoff of 1 s growing 1.6 times to 120 s (grpc-go's
// default, without its jitter of 20%, which spreads many channels'
// attempts; nextBackoff); it is back once an attempt finds it up. Its name
// is p's with " +conn".
//
// The plain baselines keep no connection state, as an HTTP client's
// endpoint list has none: a dead replica has nothing in flight, so
// least-request prefers it, and consistent hashing retries its owner until
// discovery drops it. The failures scenario runs both; a policy built on
// the library (inferlb) learns of a crash from failed calls only.
func WithConnState(p Policy) Policy {
	return Policy{Name: p.Name + " +conn", New: func(e Env) Router {
		return &connAware{Router: p.New(e), env: e,
			until: make([]time.Duration, len(e.IDs)), backoff: make([]time.Duration, len(e.IDs))}
	}}
}

// connAware is WithConnState's router: the replicas out of rotation, each
// until its next connection attempt, are left out of the members the
// wrapped router sees.
type connAware struct {
	Router
	env     Env
	members []int
	until   []time.Duration // 0: in rotation
	backoff []time.Duration
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
			c.backoff[i] = nextBackoff(c.backoff[i])
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
			c.backoff[i] = nextBackoff(0)
			c.until[i] = c.env.run.now + c.backoff[i]
			c.apply()
		}
	}, nil
}

// nextBackoff is the wait before the connection attempt after one that
// failed, which waited d (0: the connection has just broken): grpc-go's
// default backoff (gRPC's connection-backoff.md: 1 s, multiplier 1.6, at
// most 120 s), without the jitter.
func nextBackoff(d time.Duration) time.Duration {
	if d <= 0 {
		return time.Second
	}
	return min(d*8/5, 120*time.Second)
}
