package balancer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// drawHook is a Rand that runs hook once, at its first draw after hook is
// set: inside a Pick, that is after the memory's filters have read the
// members (passOverFilters) and before choose draws among them, where
// another goroutine's Done can change the members as the pick runs.
type drawHook struct {
	src  *testutil.Rand
	hook func()
}

func (r *drawHook) Uint64() uint64 {
	if h := r.hook; h != nil {
		r.hook = nil
		h()
	}
	return r.src.Uint64()
}

// A first pick goes ahead when the not-served memory passes over every
// member it could take (passOverFilters), also when the members change
// between the memory's look and the choice: m was remembered not served
// on some members, and while a pick of m's ran, another goroutine's Done
// tripped the breakers of the members the memory left it, or the memory
// came to pass over the last of them. The pick failed with
// ErrNoEndpoints, where one made a moment earlier or later goes to a
// member; TestModelFailuresUnderConcurrency lost a pick of its 16,000 in
// about 1 run in 2,500 (a runtime.Gosched between the filters and the
// choice: 189 runs in 2,000). A failover's pick still finds none.
func TestMemoryGivesWayWhenTheMembersChangeDuringThePick(t *testing.T) {
	eps := endpoints(4)
	for _, tc := range []struct {
		name    string
		lacking []int // members remembered not to serve m before the pick
		during  func(t *testing.T, b *balancer.Balancer, held []balancer.Pick)
		hold    []int // members a call is held on for during
	}{
		{"the members it leaves trip", []int{2, 3}, func(t *testing.T, b *balancer.Balancer, held []balancer.Pick) {
			for _, p := range held {
				p.Done(inferlb.Outcome{Err: errDown})
			}
			for _, s := range b.Stats()[:2] {
				require.True(t, s.BreakerOpen, s.ID)
			}
		}, []int{0, 1}},
		{"the memory comes to pass over the last member", []int{1, 2, 3}, func(t *testing.T, b *balancer.Balancer, held []balancer.Pick) {
			held[0].Done(inferlb.Outcome{NotServedModel: "m"})
		}, []int{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &drawHook{src: testutil.NewRand(1)}
			b := newBalancer(t, 4, balancer.Options{
				Clock: testutil.NewClock(), Rand: r, Scorers: constantScorers(),
				OutlierInterval: -1, BreakerFailures: 1, SlowStartWindow: -1,
			})
			t.Cleanup(b.Close)
			for _, i := range tc.lacking {
				reportNotServed(t, b, eps[i].Addr, "m")
			}
			var held []balancer.Pick
			for _, i := range tc.hold {
				held = append(held, pickOnModel(t, b, eps[i].Addr, "m"))
			}
			r.hook = func() { tc.during(t, b, held) }
			p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "m"})
			require.Nil(t, r.hook, "the hook ran inside the pick")
			require.NoError(t, err, "a first pick goes ahead when the memory passes over every member it can take")
			p.Done(inferlb.Outcome{NotServedModel: "m"}) // the memory was right
			_, err = b.PickExcept(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "m"}, "elsewhere")
			assert.ErrorIs(t, err, balancer.ErrNoEndpoints, "a failover of m's has nowhere to go")
		})
	}
}

// pickOnModel picks embedding calls for model until one lands on id, and
// returns that one; the others end well.
func pickOnModel(t *testing.T, b *balancer.Balancer, id, model string) balancer.Pick {
	t.Helper()
	for range 10_000 {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding, Model: model})
		require.NoError(t, err)
		if p.ID() == id {
			return p
		}
		p.Done(inferlb.Outcome{})
	}
	t.Fatalf("never picked %s", id)
	return balancer.Pick{}
}
