package httpbalancer_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// chaosRun drives a fleet through the transport phase by phase. Time on the
// balancer is a fake clock that each request advances by step, so breaker
// windows and slow start unfold in a bounded number of requests.
type chaosRun struct {
	t      *testing.T
	client *http.Client
	clock  *testutil.Clock

	phase    atomic.Int32
	mu       sync.Mutex
	attempts map[int32]map[string]int // phase -> endpoint -> attempts
	failures map[int32]map[string]int // phase -> endpoint -> failed attempts
	lost     atomic.Int64
	seq      atomic.Int64
}

func (c *chaosRun) onResult(r httpbalancer.Result) {
	p := c.phase.Load()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.attempts[p][r.Endpoint]++
	if r.Outcome.Err != nil {
		c.failures[p][r.Endpoint]++
	}
}

// run sends n requests from workers goroutines as phase p. If hook is set,
// the worker that completes the phase's at-th request runs it while the
// other workers keep sending.
func (c *chaosRun) run(p int32, n, workers int, step time.Duration, at int64, hook func()) {
	var done atomic.Int64
	c.mu.Lock()
	c.attempts[p], c.failures[p] = map[string]int{}, map[string]int{}
	c.mu.Unlock()
	c.phase.Store(p)
	jobs := make(chan struct{}, n)
	for range n {
		jobs <- struct{}{}
	}
	close(jobs)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range jobs {
				i := c.seq.Add(1)
				req, _ := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(int(i), false)))
				resp, err := c.client.Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err == nil && resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				if err != nil {
					c.lost.Add(1)
					c.t.Errorf("phase %d request %d lost: %v", p, i, err)
				}
				c.clock.Advance(step)
				if done.Add(1) == at && hook != nil {
					hook()
				}
			}
		})
	}
	wg.Wait()
}

func (c *chaosRun) share(p int32, id string) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	total := 0
	for _, n := range c.attempts[p] {
		total += n
	}
	return float64(c.attempts[p][id]) / float64(max(total, 1))
}

// TestChaos is the HTTP half of the resilience chaos test (issue 7): four
// backends under steady load; one is killed, then restarted on the same
// address. Every request that failed before a response started is retried
// and succeeds, traffic to the dead backend stops within a few failures, and
// after the restart its share comes back gradually over the slow-start window.
func TestChaos(t *testing.T) {
	const (
		workers = 4
		step    = 10 * time.Millisecond // fake time per request
	)
	clock := testutil.NewClock()
	bs := []*backend{newBackend(t, "a"), newBackend(t, "b"), newBackend(t, "c"), newBackend(t, "d")}
	victim := bs[3]
	var events []balancer.Event
	var evMu sync.Mutex
	run := &chaosRun{t: t, clock: clock, attempts: map[int32]map[string]int{}, failures: map[int32]map[string]int{}}
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: endpointsOf(bs...),
		BalancerOptions: balancer.Options{
			Clock:   clock,
			Rand:    testutil.NewRand(7),
			OnEvent: func(e balancer.Event) { evMu.Lock(); events = append(events, e); evMu.Unlock() },
		},
		OnResult: run.onResult,
	})
	run.client = &http.Client{Transport: tr}

	// Phase 0: steady.
	run.run(0, 200, workers, step, 0, nil)
	require.InDelta(t, 0.25, run.share(0, "d"), 0.15, "steady share of d")

	// Phases 1 and 2: d dies abruptly after 20 requests, under load: calls
	// in flight on it see resets, later ones a refused connection.
	addr := victim.addr()
	run.run(1, 150, workers, step, 20, func() {
		victim.srv.CloseClientConnections()
		victim.srv.Close()
	})
	run.run(2, 150, workers, step, 0, nil) // the second half of the outage
	deadFailures := run.failures[1]["d"] + run.failures[2]["d"]
	t.Logf("outage: %d failed attempts on d, then %d attempts in the second half; retries %+v",
		deadFailures, run.attempts[2]["d"], tr.Balancer().RetryStats())
	assert.LessOrEqual(t, deadFailures, 8, "traffic to the dead backend stops within a few failures")
	assert.Zero(t, run.attempts[2]["d"], "no traffic to the dead backend once it is out")

	// d comes back on the same address; the breaker's window passes.
	bs[3] = newBackendAt(t, "d", addr)
	clock.Advance(balancer.DefaultEjectionTime)

	// Phases 3..: recovery, in batches spanning the slow-start window.
	var shares []float64
	const batches = 8
	for p := int32(3); p < 3+batches; p++ {
		run.run(p, 100, workers, balancer.DefaultSlowStartWindow/time.Duration(batches)/100, 0, nil)
		shares = append(shares, run.share(p, "d"))
	}
	t.Logf("d's share per %v after restart: %.2f", balancer.DefaultSlowStartWindow/batches, shares)
	evMu.Lock()
	for _, e := range events {
		t.Logf("event %s %s detection=%v downtime=%v", e.Kind, e.Endpoint, e.Detection, e.Downtime)
	}
	evMu.Unlock()
	st := statsByID(tr.Balancer())["d"]
	t.Logf("lost requests: %d of %d; d: successes %d failures %d", run.lost.Load(), run.seq.Load(), st.Successes, st.Failures)

	assert.Zero(t, run.lost.Load(), "lost requests")
	assert.Greater(t, shares[len(shares)-1], 0.1, "d serves again after the restart")
	assert.Less(t, shares[0], shares[len(shares)-1], "d's share grows after the restart")
	assert.Zero(t, totalInFlight(tr.Balancer()))
}
