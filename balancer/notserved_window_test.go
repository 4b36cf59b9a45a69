package balancer_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A long call for a model that some members are remembered not to serve
// (notserved.go) and some to be too small for (window.go) goes to a
// member that both serves the model and fits the call when one exists,
// and a retry goes nowhere else. When none does, the not-served memory
// holds and the window filter gives way: a first pick goes to a member
// that serves the model, too small for the call by the memory. Its
// verdict rests on the call's tokens, which for a first pick are an
// estimate (the HTTP adapter's, from the prompt's characters), and the
// server's answer is either the call served or a refusal as too long,
// the call's true answer from a server of its model; the not-served
// answer does not depend on the tokens at all. With the window filter
// first (tried), such a call went to a member without the model: those
// whose estimate was high were served nowhere (0 of 50, against 50 of
// 50), and the others were answered "no such model", though the fleet
// serves the model.
// When every member lacks the model, or every one is too small, the
// filter that finds them all gives way and the other holds, in either
// order. A retry, which would only be refused again, finds none whenever
// no member both serves the model and fits.
func TestNotServedAndContextWindowTogether(t *testing.T) {
	eps := endpoints(4)
	e := func(i ...int) []string {
		s := make([]string, len(i))
		for j, n := range i {
			s[j] = eps[n].Addr
		}
		return s
	}
	for _, tc := range []struct {
		name          string
		lacking       []string // remembered not to serve llama
		small         []string // remembered with a window of 4,096 for llama
		want          []string // where long first picks go
		retryFinds    bool     // a retry from a member of want finds another
		shortGoesOnly []string // where short calls go
		// How calls end whose estimate of 4,200 tokens is high (they
		// take 3,900), and calls of 6,500: "served", "too long" or
		// "not served".
		highEnd, longEnd string
	}{
		{"one member serves and fits", e(0, 2), e(1, 2), e(3), false, e(1, 3), "served", "served"},
		{"two members serve and fit", e(0), e(1), e(2, 3), true, e(1, 2, 3), "served", "served"},
		{"the members serving the model are too small", e(0, 1), e(2, 3), e(2, 3), false, e(2, 3), "served", "too long"},
		{"every member lacks the model", e(0, 1, 2, 3), e(0, 1), e(2, 3), false, e(0, 1, 2, 3), "not served", "not served"},
		{"every member is too small", e(0, 1), e(0, 1, 2, 3), e(2, 3), false, e(2, 3), "served", "too long"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			b := newBalancer(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(5), OutlierInterval: -1})
			t.Cleanup(b.Close)
			for _, ep := range tc.small {
				refuse(t, b, ep, "llama", 4096)
			}
			for _, ep := range tc.lacking {
				reportNotServed(t, b, ep, "llama")
			}
			long := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama", PromptTokens: 6000, MaxOutputTokens: 500}
			got := picksOf(t, b, long, 100)
			t.Logf("long first picks: %v", got)
			for id := range got {
				assert.Contains(t, tc.want, id, "long first picks go to %v: %v", tc.want, got)
			}
			keyed := *long
			keyed.AffinityKey = 0x9e3779b97f4a7c15
			byKey := picksOf(t, b, &keyed, 50)
			assert.Len(t, byKey, 1, "a key's long calls at no load stay with one member: %v", byKey)
			for id := range byKey {
				assert.Contains(t, tc.want, id, "a key's long calls")
			}

			// A retry from a member of want: to another only if it
			// both serves the model and fits the call.
			for _, retry := range []func(*inferlb.Request, string) (balancer.Pick, error){b.PickRetry, b.PickNotServedRetry} {
				p, err := retry(long, tc.want[0])
				if !tc.retryFinds {
					assert.ErrorIs(t, err, balancer.ErrNoEndpoints, "a retry of a long call from %s", tc.want[0])
					continue
				}
				require.NoError(t, err)
				assert.Contains(t, tc.want[1:], p.ID(), "a retry of a long call")
				p.Done(inferlb.Outcome{})
			}

			short := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama", PromptTokens: 300, MaxOutputTokens: 100}
			for id := range picksOf(t, b, short, 200) {
				assert.Contains(t, tc.shortGoesOnly, id, "short calls")
			}

			// Calls as the HTTP adapter makes them: a not-served answer
			// hops (PickNotServedRetry), a too-long one goes on
			// (PickRetry) with the server's count, which is exact. The
			// estimate of 4,200 tokens is high: the call takes 3,900,
			// which every member serving the model fits.
			ends := map[string]int{}
			for _, need := range []int{4200, 6500} {
				for range 50 {
					req := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama", PromptTokens: need - 500, MaxOutputTokens: 500}
					ends[fmt.Sprintf("%d %s", need, httpCall(t, b, clock, req, tc.lacking, tc.small, need > 4200))]++
				}
			}
			t.Logf("how calls ended: %v", ends)
			assert.Equal(t, 50, ends["4200 "+tc.highEnd], "calls whose estimate was high: %v", ends)
			assert.Equal(t, 50, ends["6500 "+tc.longEnd], "long calls: %v", ends)
		})
	}
}

// httpCall makes req as the HTTP adapter does: a not-served answer hops
// (PickNotServedRetry), a too-long one goes on (PickRetry), each past the
// endpoint that answered, until an endpoint serves it or none is left.
// The members of lacking answer that they do not serve the model, those
// of small, when tooLong, that the call is longer than their window of
// 4,096. It returns how the call ended: "served", "not served" or "too
// long".
func httpCall(t *testing.T, b *balancer.Balancer, clock *testutil.Clock, req *inferlb.Request, lacking, small []string, tooLong bool) string {
	t.Helper()
	p, err := b.Pick(req)
	require.NoError(t, err)
	for range 8 {
		var end string
		switch {
		case contains(lacking, p.ID()):
			p.Done(inferlb.Outcome{NotServedModel: req.Model})
			end = "not served"
			p, err = b.PickNotServedRetry(req, p.ID())
		case tooLong && contains(small, p.ID()):
			p.Done(inferlb.Outcome{ContextWindow: 4096, Model: req.Model})
			end = "too long"
			p, err = b.PickRetry(req, p.ID())
		default:
			p.Done(inferlb.Outcome{Model: req.Model, Latency: time.Millisecond})
			return "served"
		}
		clock.Advance(time.Millisecond)
		if err != nil {
			return end
		}
	}
	t.Fatalf("a call hopped more than 8 times")
	return ""
}
