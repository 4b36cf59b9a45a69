package balancer

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
)

// stressFleets are the endpoint sets the stress tests' updaters cycle
// through: endpoints move between model groups, leave and come back, and
// weights change, so every Update moves in-flight counts between group
// counters while picks and Dones run.
func stressFleets() [][]inferlb.Endpoint {
	ep := func(id, models string, w float64) inferlb.Endpoint {
		e := inferlb.Endpoint{ID: id, Addr: id + ":1", Weight: w}
		if models != "" {
			e.Labels = map[string]string{DefaultSubsetLabel: models}
		}
		return e
	}
	return [][]inferlb.Endpoint{
		{ep("e1", "a", 1), ep("e2", "a,b", 1), ep("e3", "b", 2), ep("e4", "", 1)},
		{ep("e1", "a,b", 1), ep("e2", "b", 1), ep("e3", "", 1), ep("e5", "a", 1)},
		{ep("e1", "", 2), ep("e3", "a", 1), ep("e4", "a,b", 1)},
		{ep("e2", "a", 1), ep("e4", "b", 1), ep("e5", "", 1)},
	}
}

// After every call has ended, nothing is left in flight: not on an
// endpoint (calls, tokens), and not on any group's load counter, however
// Updates, SetReady and a second membership raced the picks and Dones.
func TestStressInFlightReturnsToZero(t *testing.T) {
	clock := testutil.NewClock()
	b := New(Options{Clock: clock, Rand: testutil.NewRand(7)})
	other, err := b.NewMembership()
	require.NoError(t, err)
	fleets := stressFleets()
	require.NoError(t, b.Update(fleets[0]))
	require.NoError(t, other.Update(fleets[1]))

	const pickers, rounds, held = 4, 3000, 4
	models := []string{"", "a", "b", "c"}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		touched = map[*endpoint]bool{}
	)
	stop := make(chan struct{})
	var upd sync.WaitGroup
	upd.Add(1)
	go func() {
		defer upd.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			f := fleets[i%len(fleets)]
			_ = b.Update(f)
			_ = other.Update(fleets[(i+1)%len(fleets)])
			b.SetReady(f[i%len(f)].ID, i%3 != 0)
			other.SetReady(f[(i+1)%len(f)].ID, i%2 == 0)
		}
	}()
	for w := range pickers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out []Pick
			seen := map[*endpoint]bool{}
			for i := range rounds {
				req := &inferlb.Request{Model: models[(i+w)%len(models)], PromptTokens: 100 + i%7, MaxOutputTokens: 50}
				pick := b.Pick
				if i%2 == 1 {
					pick = other.Pick
				}
				p, err := pick(req)
				if err == nil {
					seen[p.e] = true
					out = append(out, p)
				}
				if len(out) > held {
					out[0].Done(inferlb.Outcome{})
					out = out[1:]
				}
			}
			for i := range out {
				out[i].Done(inferlb.Outcome{})
			}
			mu.Lock()
			for e := range seen {
				touched[e] = true
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(stop)
	upd.Wait()

	for e := range touched {
		assert.Zero(t, e.inFlight.Load(), "%s (serial %d) in flight", e.id, e.serial)
		assert.Zero(t, e.inFlightTokens.Load(), "%s (serial %d) tokens in flight", e.id, e.serial)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range []*Membership{b.def, other} {
		for key, c := range m.loads {
			assert.Zero(t, c.Load(), "membership %d group %q load", m.idx, key)
		}
		snap := m.snap.Load()
		groups := []*group{snap.all, snap.anyModel}
		for _, g := range snap.byModel {
			groups = append(groups, g)
		}
		for _, g := range groups {
			if g != nil {
				assert.Zero(t, g.inFlight(), fmt.Sprintf("membership %d group of %d load", m.idx, len(g.members)))
			}
		}
	}
}
