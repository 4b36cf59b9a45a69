package balancer_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// poolEndpoint is one endpoint of an outlier test's fleet: the models it
// serves (its "model" label, empty for none), whether it is listed by a
// second Membership besides the Balancer's own (other) or only by that one
// (otherOnly), and how many of every ten calls to it fail.
type poolEndpoint struct {
	id        string
	models    string
	other     bool
	otherOnly bool
	fail      int
}

func replicas(prefix, models string, n, fail int) []poolEndpoint {
	out := make([]poolEndpoint, n)
	for i := range out {
		out[i] = poolEndpoint{id: fmt.Sprintf("%s-%d", prefix, i), models: models, fail: fail}
	}
	return out
}

type pickerAt interface {
	PickAt(req *inferlb.Request, serial uint64) (balancer.Pick, error)
}

// runOutlierInterval builds a Balancer over fleet, sends each endpoint
// 100 calls across one OutlierInterval (fail of every ten failing, spread
// through it), then ends one more call to have the interval judged, and
// returns the endpoints ejected and those whose ejection was capped.
func runOutlierInterval(t *testing.T, fleet []poolEndpoint) (ejected, capped []string) {
	t.Helper()
	clock := testutil.NewClock()
	rec := &recorder{}
	b := balancer.New(balancer.Options{
		Clock: clock, Rand: testutil.NewRand(5), OnEvent: rec.record, Scorers: constantScorers(),
		BreakerFailures: -1, PanicThreshold: -1,
	})
	var own, other []inferlb.Endpoint
	for _, pe := range fleet {
		ep := inferlb.Endpoint{Addr: pe.id}
		if pe.models != "" {
			ep.Labels = map[string]string{"model": pe.models}
		}
		if !pe.otherOnly {
			own = append(own, ep)
		}
		if pe.other || pe.otherOnly {
			other = append(other, ep)
		}
	}
	require.NoError(t, b.Update(own))
	m, err := b.NewMembership()
	require.NoError(t, err)
	require.NoError(t, m.Update(other))
	call := func(pe poolEndpoint, failed bool) {
		var via pickerAt = b
		if pe.otherOnly {
			via = m
		}
		serial, ok := b.Serial(pe.id)
		require.True(t, ok, pe.id)
		p, err := via.PickAt(&inferlb.Request{}, serial)
		require.NoError(t, err)
		require.Equal(t, pe.id, p.ID(), "nothing is held out before the interval ends")
		var o inferlb.Outcome
		if failed {
			o.Err = errDown
		}
		p.Done(o)
	}
	const rounds = 100
	for r := range rounds {
		for _, pe := range fleet {
			call(pe, r%10 < pe.fail)
		}
		clock.Advance(balancer.DefaultOutlierInterval / rounds)
	}
	require.Empty(t, rec.kinds(), "judged only once the interval is over")
	call(fleet[0], false)
	for _, ev := range rec.events {
		switch ev.Kind {
		case balancer.EventEjected:
			ejected = append(ejected, ev.Endpoint)
		case balancer.EventCapped:
			capped = append(capped, ev.Endpoint)
		}
	}
	return ejected, capped
}

// TestOutlierDetectionIsPerPool: outlier detection judges each endpoint
// against the median success rate of its own pool (a model's endpoints, a
// Membership's), the pools MaxEjectedFraction caps. Against one fleet-wide
// median, a model whose calls fail more often by nature (a harder task,
// bad input that some of its callers send) lost its healthy endpoints to
// the model with the most endpoints, and a bad endpoint of a small model
// went unseen when a big model's failing endpoints pulled the median down.
func TestOutlierDetectionIsPerPool(t *testing.T) {
	join := func(parts ...[]poolEndpoint) []poolEndpoint {
		var out []poolEndpoint
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	shared := func(models string, fail int, other bool) []poolEndpoint {
		return []poolEndpoint{{id: "shared", models: models, fail: fail, other: other}}
	}
	for _, tc := range []struct {
		name    string
		fleet   []poolEndpoint
		ejected []string
	}{
		// Fleet-wide median 1.0: small at 0.7 are all outliers; one was
		// ejected, the other two capped.
		{"a model's own error rate is no outlier",
			join(replicas("big", "big", 8, 0), replicas("small", "small", 3, 3)), nil},
		// Fleet-wide median 0.6: bad-0 at 0.5 is within the margin.
		{"a bad endpoint of a small model is found",
			join(replicas("big", "big", 8, 4), replicas("small", "small", 2, 0), replicas("bad", "small", 1, 5)),
			[]string{"bad-0"}},
		// A healthy big fleet and a small one failing by nature: each
		// pool's own outlier is found, and only it.
		{"each pool's own outlier",
			join(replicas("big", "big", 7, 0), replicas("bad", "big", 1, 3),
				replicas("small", "small", 3, 4), replicas("worse", "small", 1, 7)),
			[]string{"bad-0", "worse-0"}},
		// An endpoint serving two models is in both pools; it is an outlier
		// in one of them, where its peers all succeed. (Fleet-wide median
		// 0.6: not an outlier.)
		{"an outlier in one of its pools",
			join(replicas("big", "big", 4, 4), replicas("small", "small", 2, 0), shared("big,small", 5, false)),
			[]string{"shared"}},
		// The same, with the healthy pool too small to judge it: two
		// judged in all. It is no outlier in the pool with peers enough.
		{"an outlier only where it has peers enough",
			join(replicas("big", "big", 4, 4), replicas("small", "small", 1, 0), shared("big,small", 5, false)),
			nil},
		// Two Memberships (two channels on one Balancer) are two pools:
		// the shared endpoint is judged in each, against the other's
		// endpoints only where it is listed with them.
		{"an outlier in one of its memberships",
			join(replicas("own", "", 4, 4), shared("", 5, true), []poolEndpoint{
				{id: "other-0", otherOnly: true}, {id: "other-1", otherOnly: true}}),
			[]string{"shared"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ejected, capped := runOutlierInterval(t, tc.fleet)
			assert.Equal(t, tc.ejected, ejected)
			assert.Empty(t, capped)
		})
	}
}

// TestOutlierEvaluationAllocatesNothing: an evaluation judges every pool
// of the fleet, and it runs inside a Done; its scratch is kept from one
// interval to the next, so once the fleet has been judged it allocates
// nothing.
func TestOutlierEvaluationAllocatesNothing(t *testing.T) {
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{
		Clock: clock, Rand: testutil.NewRand(6), Scorers: constantScorers(),
		OutlierMinRequests: 1,
	})
	var eps []inferlb.Endpoint
	for _, m := range []string{"a", "b", "a,b", ""} {
		for i := range 4 {
			ep := inferlb.Endpoint{Addr: fmt.Sprintf("%s/%d", m, i)}
			if m != "" {
				ep.Labels = map[string]string{"model": m}
			}
			eps = append(eps, ep)
		}
	}
	require.NoError(t, b.Update(eps))
	serials := make([]uint64, len(eps))
	for i, ep := range eps {
		s, ok := b.Serial(ep.Addr)
		require.True(t, ok)
		serials[i] = s
	}
	req := &inferlb.Request{} // escapes: one for every call
	interval := func() {
		clock.Advance(balancer.DefaultOutlierInterval)
		for _, s := range serials {
			p, err := b.PickAt(req, s)
			if err != nil {
				panic(err)
			}
			p.Done(inferlb.Outcome{})
		}
	}
	interval()
	interval()
	assert.Zero(t, testing.AllocsPerRun(20, interval))
	for _, s := range b.Stats() {
		assert.Zero(t, s.Ejections, s.ID)
	}
}
