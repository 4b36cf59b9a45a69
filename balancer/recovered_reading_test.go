package balancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// lastReport is the last load report of a replica about to crash, as its
// endpoint-load-metrics header (or ORCA trailer) carries it: KV cache
// full, a long queue, its application busy.
func lastReport(at time.Time) telemetry.Sample {
	s := telemetry.Sample{Time: at}
	s.Set(telemetry.KVCacheUsage, 0.95)
	s.Set(telemetry.Waiting, 30)
	s.Set(telemetry.Running, 20)
	s.Set(telemetry.AppUtil, 0.97)
	return s
}

// busyShare runs a closed loop of n LLM calls, 32 outstanding (the peers
// are busy), the clock advancing step per pick, and returns how many went
// to id. Calls bring no load report (streamed chat: vLLM sends its header
// on non-streamed responses only), so only the Store's readings price.
func busyShare(t *testing.T, b *balancer.Balancer, clock *testutil.Clock, id string, n int, step time.Duration) int {
	t.Helper()
	got := 0
	var window []balancer.Pick
	req := &inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 800, MaxOutputTokens: 300}
	for range n {
		p, err := b.Pick(req)
		require.NoError(t, err)
		if p.ID() == id {
			got++
		}
		window = append(window, p)
		if len(window) == 32 {
			window[0].Done(inferlb.Outcome{})
			window = window[1:]
		}
		clock.Advance(step)
	}
	for _, p := range window {
		p.Done(inferlb.Outcome{})
	}
	return got
}

// A replica that crashed, was held out for its failures and came back is
// a new process, idle. The last load report of the old one (KV cache 95%,
// 30 waiting) priced it as full: it lost every comparison, so no call went
// there to bring a fresh report (a load header comes with a response), and
// it sat idle until the report aged out (TelemetryMaxAge, 30 s) while its
// peers queued. The reading observed before the failure exclusion is
// expired when it begins, for a tripped breaker and an outlier ejection
// alike; the same replica with no reading is the measure.
func TestFailureExclusionExpiresTheOldProcessReading(t *testing.T) {
	const n, step = 2000, 5 * time.Millisecond // 10 s of traffic after the return
	bad := endpoints(4)[0].Addr
	for _, how := range []string{"breaker", "outlier ejection"} {
		share := func(t *testing.T, reading bool) int {
			clock := testutil.NewClock()
			rec := &recorder{}
			opts := balancer.Options{Clock: clock, Rand: testutil.NewRand(5), OnEvent: rec.record, Scorers: constantScorers()}
			if how == "breaker" {
				opts.OutlierInterval = -1
			} else {
				opts.BreakerFailures = -1
			}
			b := newBalancer(t, 4, opts)
			if how == "breaker" {
				if reading {
					b.Publish(bad, lastReport(clock.Now()))
				}
				clock.Advance(time.Second) // the crash
				for range balancer.DefaultBreakerFailures {
					p := pickOn(t, b, bad)
					p.Done(inferlb.Outcome{Err: errDown})
				}
				require.Equal(t, []balancer.EventKind{balancer.EventTripped}, rec.kinds())
				clock.Advance(balancer.DefaultEjectionTime) // restarted: the probes succeed
				for range balancer.DefaultBreakerProbes {
					p := pickOn(t, b, bad)
					p.Done(inferlb.Outcome{})
				}
				require.Equal(t, balancer.EventRecovered, rec.last().Kind)
			} else {
				// Failing half its calls for ten seconds (calls of no
				// service: the constant scorer, so the reading does not
				// steer them), its last report taken in the middle.
				failEveryOther(t, b, clock, bad, 2000, balancer.DefaultOutlierInterval/2000)
				reported := clock.Now()
				if reading {
					b.Publish(bad, lastReport(reported))
				}
				failEveryOther(t, b, clock, bad, 2000, balancer.DefaultOutlierInterval/2000)
				require.Equal(t, []balancer.EventKind{balancer.EventEjected}, rec.kinds())
				require.True(t, rec.last().At.After(reported), "the reading was taken before the ejection")
				clock.Set(rec.last().Until)
			}
			require.False(t, stat(t, b, bad).BreakerOpen)
			return busyShare(t, b, clock, bad, n, step)
		}
		t.Run(how, func(t *testing.T) {
			without, with := share(t, false), share(t, true)
			t.Logf("%s: picks of %d in the 10 s after the return: %d with the old reading, %d without", how, n, with, without)
			require.Greater(t, without, n/100, "the measure: a returning replica with no reading takes calls")
			assert.GreaterOrEqual(t, with, without*3/4, "the old process's reading priced the returned replica out")
		})
	}
}

// What the exclusion does not expire: a reading observed since it began
// (a Poller scraping the new process while its calls were held out, or
// the answer to a half-open probe) describes the process that returns;
// hardware fields (GPU memory size, temperature) describe the GPU, not
// the process; and an overload cooldown keeps everything, as the server
// said it is busy and its reading says how busy.
func TestFailureExclusionKeepsReadingsTakenSince(t *testing.T) {
	clock := testutil.NewClock()
	rec := &recorder{}
	b := newBalancer(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(5), OnEvent: rec.record, OutlierInterval: -1, Scorers: constantScorers()})
	bad := endpoints(4)[0].Addr
	old := lastReport(clock.Now())
	old.Set(telemetry.GPUMemTotal, 80e9)
	old.Set(telemetry.GPUTemp, 70)
	b.Publish(bad, old)
	clock.Advance(time.Second)

	p := pickOn(t, b, bad)
	p.Done(inferlb.Outcome{Overloaded: true, RetryAfter: time.Second})
	require.Equal(t, []balancer.EventKind{balancer.EventCooldown}, rec.kinds())
	assert.Equal(t, old.Has, stat(t, b, bad).Telemetry.Has, "an overload cooldown expired the server's reading")
	clock.Advance(2 * time.Second)

	for range balancer.DefaultBreakerFailures {
		p := pickOn(t, b, bad)
		p.Done(inferlb.Outcome{Err: errDown})
	}
	require.Equal(t, balancer.EventTripped, rec.last().Kind)
	tel := stat(t, b, bad).Telemetry
	// (GPU memory's size is held, and left out of what the scorers see
	// while no KV-cache usage is: see TestExpiredKVReadingKeepsMemoryOutOfThePrice.)
	assert.Equal(t, telemetry.FieldSet(1<<telemetry.GPUTemp), tel.Has, "the trip expires the process's load, not the GPU's")
	assert.NotZero(t, b.Telemetry().Slot(bad).Observed(telemetry.GPUMemTotal), "the trip expired the GPU's memory size")

	clock.Advance(time.Second) // a Poller scrapes the new process
	fresh := telemetry.Sample{Time: clock.Now()}
	fresh.Set(telemetry.Running, 4)
	fresh.Set(telemetry.KVCacheUsage, 0.2)
	b.Publish(bad, fresh)
	clock.Advance(balancer.DefaultEjectionTime)
	for range balancer.DefaultBreakerProbes {
		p := pickOn(t, b, bad)
		p.Done(inferlb.Outcome{})
	}
	require.Equal(t, balancer.EventRecovered, rec.last().Kind)
	tel = stat(t, b, bad).Telemetry
	kv, ok := tel.Get(telemetry.KVCacheUsage)
	assert.True(t, ok, "a reading taken during the exclusion was expired")
	assert.Equal(t, 0.2, kv)
	running, _ := tel.Get(telemetry.Running)
	assert.Equal(t, 4.0, running)
	assert.False(t, tel.Has.Has(telemetry.Waiting), "the old process's queue came back")
}

// vLLM pre-allocates its GPU memory (0.9-0.95 of it), so a replica that
// reports its KV-cache usage is not priced by its memory. Once a failure
// exclusion expired the old process's KV reading, DCGM's memory reading,
// scraped during the exclusion, priced the returned replica as a server
// that allocates as it goes, 5.8x its peers, until its next KV reading:
// which, with calls that bring no load header, only a scrape could bring.
func TestExpiredKVReadingKeepsMemoryOutOfThePrice(t *testing.T) {
	const n, step = 2000, 5 * time.Millisecond
	bad := endpoints(4)[0].Addr
	share := func(t *testing.T, dcgm bool) int {
		clock := testutil.NewClock()
		rec := &recorder{}
		b := newBalancer(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(5), OnEvent: rec.record, OutlierInterval: -1, Scorers: constantScorers()})
		scrape := func(id string) {
			s := telemetry.Sample{Time: clock.Now()}
			s.Set(telemetry.GPUMemUsed, 76e9)
			s.Set(telemetry.GPUMemTotal, 80e9)
			b.Publish(id, s)
		}
		b.Publish(bad, lastReport(clock.Now()))
		clock.Advance(time.Second)
		for range balancer.DefaultBreakerFailures {
			p := pickOn(t, b, bad)
			p.Done(inferlb.Outcome{Err: errDown})
		}
		require.Equal(t, []balancer.EventKind{balancer.EventTripped}, rec.kinds())
		clock.Advance(balancer.DefaultEjectionTime)
		for _, ep := range endpoints(4) {
			if dcgm {
				scrape(ep.Addr) // after the trip: kept
			}
			if ep.Addr != bad {
				s := telemetry.Sample{Time: clock.Now()}
				s.Set(telemetry.KVCacheUsage, 0.5)
				b.Publish(ep.Addr, s)
			}
		}
		for range balancer.DefaultBreakerProbes {
			p := pickOn(t, b, bad)
			p.Done(inferlb.Outcome{})
		}
		require.Equal(t, balancer.EventRecovered, rec.last().Kind)
		return busyShare(t, b, clock, bad, n, step)
	}
	without, with := share(t, false), share(t, true)
	t.Logf("picks of %d in the 10 s after the return: %d with DCGM's memory at 95%%, %d without", n, with, without)
	require.Greater(t, without, n/100)
	assert.GreaterOrEqual(t, with, without*3/4, "the memory of a server that pre-allocates priced it")
}
