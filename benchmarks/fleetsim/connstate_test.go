package fleetsim

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
)

// A replica whose call was refused leaves the rotation at once, stays out
// while its connection attempts (1 s, then 1.6 times longer each: grpc-go's
// backoff, which the simulator had doubling) find it down, keeps
// out across a discovery update, and is back at the first attempt that
// finds it up; a failure that is not the connection's (a 5xx answer, an
// overload) moves nothing.
func TestConnStateTakesABrokenReplicaOutUntilAnAttemptFindsItUp(t *testing.T) {
	r := &run{reps: []*replica{{up: true}, {up: true}, {up: true}}}
	p := WithConnState(RoundRobin())
	assert.Equal(t, "round-robin +conn", p.Name)
	rt := p.New(Env{Seed: 1, IDs: []string{"r0", "r1", "r2"}, run: r})
	rt.SetMembers([]int{0, 1, 2})

	picks := func(n int) map[int]int {
		t.Helper()
		got := map[int]int{}
		for range n {
			i, done, err := rt.Pick(&Request{})
			require.NoError(t, err)
			done(inferlb.Outcome{})
			got[i]++
		}
		return got
	}
	// Fail one call on replica 1 with err, at the current time.
	failOn1 := func(err error) {
		t.Helper()
		for range 3 {
			i, done, pickErr := rt.Pick(&Request{})
			require.NoError(t, pickErr)
			if i == 1 {
				done(inferlb.Outcome{Err: err})
				return
			}
			done(inferlb.Outcome{})
		}
		t.Fatal("replica 1 was not picked in a round")
	}

	failOn1(errors.New("fleetsim test: the replica answered 500"))
	assert.Equal(t, map[int]int{0: 10, 1: 10, 2: 10}, picks(30), "an answer is not a broken connection")

	r.reps[1].up = false
	failOn1(errRefused)
	assert.Equal(t, map[int]int{0: 15, 2: 15}, picks(30), "refused: out of rotation")

	r.now += time.Second // the first attempt finds it down: the next in 1.6 s
	assert.Equal(t, map[int]int{0: 5, 2: 5}, picks(10))
	rt.SetMembers([]int{0, 1, 2}) // discovery still lists it
	assert.Equal(t, map[int]int{0: 5, 2: 5}, picks(10), "a discovery update does not bring it back")

	r.reps[1].up = true
	r.now += 1599 * time.Millisecond
	assert.Equal(t, map[int]int{0: 5, 2: 5}, picks(10), "back only at the next attempt")
	r.now += time.Millisecond
	assert.Equal(t, map[int]int{0: 10, 1: 10, 2: 10}, picks(30), "the attempt found it up")

	// A crash ends its calls under way: out again, and the backoff starts
	// over at 1 s.
	r.reps[1].up = false
	failOn1(errCrashed)
	r.reps[1].up = true
	assert.Equal(t, map[int]int{0: 5, 2: 5}, picks(10))
	r.now += time.Second
	assert.Equal(t, map[int]int{0: 10, 1: 10, 2: 10}, picks(30))
}

// The backoff between connection attempts is grpc-go's default without its
// jitter: 1 s, times 1.6 after each failed attempt, at most 120 s.
func TestConnStateBackoffIsGRPCs(t *testing.T) {
	var got []time.Duration
	d := time.Duration(0)
	for range 14 {
		d = nextBackoff(d)
		got = append(got, d)
	}
	assert.Equal(t, []time.Duration{
		time.Second, 1600 * time.Millisecond, 2560 * time.Millisecond, 4096 * time.Millisecond,
		6553600 * time.Microsecond, 10485760 * time.Microsecond, 16777216 * time.Microsecond,
		26843545600 * time.Nanosecond, 42949672960 * time.Nanosecond, 68719476736 * time.Nanosecond,
		109951162777 * time.Nanosecond, 120 * time.Second, 120 * time.Second, 120 * time.Second,
	}, got)
}
