package httpbalancer_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

// scriptedDNS answers the i-th lookup (from 0, the one NewTransport makes)
// with answer(i).
type scriptedDNS struct {
	mu     sync.Mutex
	n      int
	answer func(i int) ([]string, error)
}

func (d *scriptedDNS) LookupHost(ctx context.Context, host string) ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	i := d.n
	d.n++
	return d.answer(i)
}

func fleetAddrs(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.0.0.%d", i+1)
	}
	return out
}

// churn counts, over answers resolutions, the endpoints that left the
// Balancer (every replica is alive throughout, so each is a live replica
// dropped with its state), those that came back after leaving (with a new
// state), and those found in slow start at a resolution (also a replica
// new to the set: the first answers name only part of the fleet). Before
// each resolution 10 calls succeed; lost counts those the endpoints
// served at the end no longer show (their history went with them).
type churn struct{ removed, back, ramping, final, lost int }

func measureChurn(t *testing.T, tr *httpbalancer.Transport, interval time.Duration, answers int) churn {
	var c churn
	prev, seen := map[string]bool{}, map[string]bool{}
	for _, id := range ids(tr) {
		prev[id], seen[id] = true, true
	}
	calls := 0
	for range answers {
		for range 10 {
			p, err := tr.Balancer().Pick(&inferlb.Request{})
			require.NoError(t, err)
			p.Done(inferlb.Outcome{})
			calls++
		}
		time.Sleep(interval)
		synctest.Wait()
		cur := map[string]bool{}
		for _, s := range tr.Balancer().Stats() {
			cur[s.ID] = true
			if !prev[s.ID] && seen[s.ID] {
				c.back++
			}
			seen[s.ID] = true
			if s.RampFactor < 1 {
				c.ramping++
			}
		}
		for id := range prev {
			if !cur[id] {
				c.removed++
			}
		}
		prev = cur
	}
	c.final = len(prev)
	c.lost = calls
	for _, s := range tr.Balancer().Stats() {
		c.lost -= int(s.Successes)
	}
	return c
}

// TestDiscoverySubsetAnswersKeepLiveReplicas: a DNS service that answers 8
// of a fleet's 12 records at a time (Route 53 multivalue answers) used to
// make every resolution drop the live replicas it left out and add back
// those it named again, new, in slow start: 4 of each per answer when the
// subset rotates, 2.7 when it is drawn at random, and nearly every call's
// record went with them. With Grace (its default) the fleet stays whole:
// none when it rotates, and at random a replica leaves only when left out
// of four answers in a row ((1/3)^4).
func TestDiscoverySubsetAnswersKeepLiveReplicas(t *testing.T) {
	const answers = 100
	all := fleetAddrs(12)
	rotating := func(i int) ([]string, error) {
		out := make([]string, 8)
		for j := range out {
			out[j] = all[(4*i+j)%len(all)]
		}
		return out, nil
	}
	for _, tc := range []struct {
		name   string
		random bool
		grace  time.Duration
		check  func(t *testing.T, c churn)
	}{
		{"rotating, no grace", false, -1, func(t *testing.T, c churn) {
			// The 4 first named by the second answer join once, new.
			assert.Greater(t, c.lost, 9*answers, "nearly every call's history lost")
			c.lost = 0
			assert.Equal(t, churn{removed: 4 * answers, back: 4*answers - 4, ramping: 4 * answers, final: 8}, c)
		}},
		{"rotating, default grace", false, 0, func(t *testing.T, c churn) {
			assert.Equal(t, churn{ramping: 4, final: 12}, c, "no call's history lost")
		}},
		{"random, no grace", true, -1, func(t *testing.T, c churn) {
			assert.Greater(t, c.removed, 2*answers)
			assert.Greater(t, c.lost, 9*answers)
			assert.Equal(t, 8, c.final)
		}},
		{"random, default grace", true, 0, func(t *testing.T, c churn) {
			// Expected 12 x 2/3 x (1/3)^4 = 0.1 per answer.
			assert.LessOrEqual(t, c.removed, answers/5)
			assert.LessOrEqual(t, c.back, answers/5)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				answer := rotating
				if tc.random {
					r := rand.New(rand.NewPCG(1, 2))
					answer = func(int) ([]string, error) {
						out := make([]string, 0, 8)
						for _, j := range r.Perm(len(all))[:8] {
							out = append(out, all[j])
						}
						return out, nil
					}
				}
				dns := &scriptedDNS{answer: answer}
				tr, err := httpbalancer.NewTransport(httpbalancer.Options{Discovery: &httpbalancer.Discovery{
					Target: "vllm.svc:8000", LookupHost: dns.LookupHost, Grace: tc.grace}})
				require.NoError(t, err)
				defer tr.Close()
				c := measureChurn(t, tr, httpbalancer.DefaultDiscoveryInterval, answers)
				t.Logf("%s: over %d answers, %d live replicas dropped, %d added back, %d found in slow start; %d served at the end, %d of %d calls gone from their history",
					tc.name, answers, c.removed, c.back, c.ramping, c.final, c.lost, 10*answers)
				tc.check(t, c)
			})
		})
	}
}

// TestDiscoveryGoneAddressLeavesAfterGrace: an address the answers stop
// naming leaves with the first answer at least Grace after the first one
// without it, counting good answers only: failed and empty ones keep the
// set as it is, as they always did.
func TestDiscoveryGoneAddressLeavesAfterGrace(t *testing.T) {
	const interval = 10 * time.Second
	four := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"}
	three := four[:3]
	good := func(int) ([]string, error) { return three, nil }
	for _, tc := range []struct {
		name  string
		grace time.Duration
		after func(i int) ([]string, error) // answers from the second on
		// leaves is the first resolution (from 1, the first after the one
		// in NewTransport) whose set lacks 10.0.0.4.
		leaves int
	}{
		{"no grace", -1, good, 1},
		{"default: three intervals", 0, good, 4},
		{"grace below an interval", time.Nanosecond, good, 2},
		{"grace of 2.5 intervals", 25 * time.Second, good, 4},
		{"grace of exactly 2 intervals", 20 * time.Second, good, 3},
		{"failed and empty answers do not count", 0, func(i int) ([]string, error) {
			switch i % 3 {
			case 1:
				return nil, errors.New("SERVFAIL")
			case 2:
				return nil, nil
			}
			return three, nil
		}, 12}, // good answers at 3, 6, 9 and 12
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dns := &scriptedDNS{answer: func(i int) ([]string, error) {
					if i == 0 {
						return four, nil
					}
					return tc.after(i)
				}}
				tr, err := httpbalancer.NewTransport(httpbalancer.Options{Discovery: &httpbalancer.Discovery{
					Target: "vllm.svc:8000", Interval: interval, LookupHost: dns.LookupHost, Grace: tc.grace,
					OnError: func(error) {}}})
				require.NoError(t, err)
				defer tr.Close()
				require.Len(t, ids(tr), 4)
				for i := 1; i <= tc.leaves+3; i++ {
					time.Sleep(interval)
					synctest.Wait()
					got := ids(tr)
					if i < tc.leaves {
						require.Contains(t, got, "10.0.0.4:8000", "resolution %d", i)
					} else {
						require.Equal(t, []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}, got, "resolution %d", i)
					}
				}
			})
		})
	}
}

// TestDiscoveryKeptAddressesBounded: the addresses kept after the answers
// leave them out are at most as many as the last answer has, the ones
// left out of the fewest answers first. Answers that name new addresses
// every time (a resolver gone wrong, or hostile) cannot grow the set past
// twice an answer however long Grace is, and after a scale-down the
// replicas gone cannot outnumber those answered.
func TestDiscoveryKeptAddressesBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const interval = 10 * time.Second
		fresh := func(i int) []string {
			out := make([]string, 8)
			for j := range out {
				out[j] = fmt.Sprintf("10.%d.%d.%d", i>>8&255, i&255, j)
			}
			return out
		}
		var mu sync.Mutex
		next := fresh
		dns := &scriptedDNS{answer: func(i int) ([]string, error) {
			mu.Lock()
			defer mu.Unlock()
			return next(i), nil
		}}
		tr, err := httpbalancer.NewTransport(httpbalancer.Options{Discovery: &httpbalancer.Discovery{
			Target: "vllm.svc:8000", Interval: interval, LookupHost: dns.LookupHost, Grace: math.MaxInt64, IDByHost: true}})
		require.NoError(t, err)
		defer tr.Close()
		for i := 1; i <= 1000; i++ {
			time.Sleep(interval)
			synctest.Wait()
			got := ids(tr)
			want := fresh(i)
			// The previous answer is kept (left out once), not the older
			// ones (left out more).
			want = append(want, fresh(i-1)...)
			slices.Sort(want)
			require.Equal(t, want, got, "resolution %d", i)
		}

		// A scale-down from 12 to 2: two of the 10 gone are kept, the
		// first in string order among those left out once.
		mu.Lock()
		next = func(int) []string { return fleetAddrs(12) }
		mu.Unlock()
		time.Sleep(interval)
		synctest.Wait()
		mu.Lock()
		next = func(int) []string { return fleetAddrs(2) }
		mu.Unlock()
		time.Sleep(interval)
		synctest.Wait()
		assert.Equal(t, []string{"10.0.0.1", "10.0.0.10", "10.0.0.11", "10.0.0.2"}, ids(tr))
	})
}
