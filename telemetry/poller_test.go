package telemetry_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a Sink that keeps what it was given.
type recorder struct {
	mu  sync.Mutex
	ids []string
	got []telemetry.Sample
}

func (r *recorder) Publish(id string, s telemetry.Sample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ids = append(r.ids, id)
	r.got = append(r.got, s)
}

// scripted is a Source that returns errs[i] on its i-th call (nil means one
// good observation; the last entry repeats) and records when it was called.
type scripted struct {
	mu    sync.Mutex
	errs  []error
	calls []time.Duration // since the bubble's start
	start time.Time
}

func (s *scripted) Collect(ctx context.Context) ([]telemetry.Observation, error) {
	s.mu.Lock()
	i := len(s.calls)
	s.calls = append(s.calls, time.Since(s.start))
	err := s.errs[min(i, len(s.errs)-1)]
	s.mu.Unlock()
	if err != nil && !errors.Is(err, errHalf) {
		return nil, err
	}
	return []telemetry.Observation{{EndpointID: "a", Sample: sample(time.Time{}, float64(telemetry.Waiting), float64(i))}}, err
}

func (s *scripted) times() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.calls...)
}

// runFor runs p in the bubble for d of fake time, then stops it and waits
// for Run to return.
func runFor(t *testing.T, p *telemetry.Poller, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	time.Sleep(d)
	synctest.Wait()
	cancel()
	assert.ErrorIs(t, <-done, context.Canceled)
}

var (
	errDown = errors.New("exporter down")
	// errHalf is a partial result: the scripted source returns its
	// observation along with it.
	errHalf = fmt.Errorf("%w: one family unreadable", telemetry.ErrPartial)
	// errNothing wraps ErrPartial but comes with no observation: the source
	// answered nothing usable, so the round is a failure.
	errNothing = fmt.Errorf("%w: every family unreadable", telemetry.ErrPartial)
)

func secs(v ...float64) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x * float64(time.Second))
	}
	return out
}

func TestPollerSchedule(t *testing.T) {
	tests := []struct {
		name string
		opts telemetry.PollerOptions
		errs []error
		run  time.Duration
		want []time.Duration
		st   telemetry.PollerStats
	}{
		{
			name: "steady interval, first round at once",
			opts: telemetry.PollerOptions{Interval: 10 * time.Second, Jitter: -1},
			errs: []error{nil},
			run:  35 * time.Second,
			want: secs(0, 10, 20, 30),
			st:   telemetry.PollerStats{Rounds: 4, Published: 4},
		},
		{
			name: "backoff doubles to the cap and resets after a success",
			opts: telemetry.PollerOptions{Interval: 10 * time.Second, MaxBackoff: 30 * time.Second, Jitter: -1},
			errs: []error{errDown, errDown, errDown, nil, errDown, nil},
			run:  125 * time.Second,
			// fail +20, fail +30 (40 capped), fail +30, ok +10, fail +20, ok
			want: secs(0, 20, 50, 80, 90, 110, 120),
			st:   telemetry.PollerStats{Rounds: 7, Failures: 4, Published: 3},
		},
		{
			name: "a partial result is a success and is published",
			opts: telemetry.PollerOptions{Interval: 10 * time.Second, Jitter: -1},
			errs: []error{errHalf},
			run:  15 * time.Second,
			want: secs(0, 10),
			st:   telemetry.PollerStats{Rounds: 2, Partial: 2, Published: 2},
		},
		{
			name: "a partial error without observations is a failure",
			opts: telemetry.PollerOptions{Interval: 10 * time.Second, Jitter: -1},
			errs: []error{errNothing},
			run:  25 * time.Second,
			want: secs(0, 20),
			st:   telemetry.PollerStats{Rounds: 2, Failures: 2, ConsecutiveFailures: 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				src := &scripted{errs: tt.errs, start: time.Now()}
				sink := &recorder{}
				p, err := telemetry.NewPoller(src, sink, tt.opts)
				require.NoError(t, err)
				runFor(t, p, tt.run)
				assert.Equal(t, tt.want, src.times())
				assert.Equal(t, tt.st, p.Stats())
			})
		})
	}
}

func TestPollerJitter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &scripted{errs: []error{nil}, start: time.Now()}
		// u = 0, 0.5, 0.75 of the range: delays of 0.9, 1.0 and 1.05 intervals.
		p, err := telemetry.NewPoller(src, &recorder{}, telemetry.PollerOptions{
			Interval: 10 * time.Second, Jitter: 0.1, Rand: testutil.NewScript(0, 1<<63, 3<<62),
		})
		require.NoError(t, err)
		runFor(t, p, 30*time.Second)
		got := src.times()
		want := secs(0, 9, 19, 29.5)
		require.Len(t, got, len(want))
		for i := range want {
			assert.InDelta(t, want[i], got[i], float64(time.Microsecond), "call %d", i)
		}
	})
}

// Without a Rand the Poller draws its jitter from the runtime's source:
// every delay lies within ±Jitter of Interval, and they differ, so
// replicas that started together drift apart.
func TestPollerDefaultRandJitters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &scripted{errs: []error{nil}, start: time.Now()}
		p, err := telemetry.NewPoller(src, &recorder{}, telemetry.PollerOptions{Interval: 10 * time.Second, Jitter: 0.1})
		require.NoError(t, err)
		runFor(t, p, 200*time.Second)
		got := src.times()
		require.GreaterOrEqual(t, len(got), 10)
		gaps := map[time.Duration]bool{}
		for i := 1; i < len(got); i++ {
			d := got[i] - got[i-1]
			assert.GreaterOrEqual(t, d, 9*time.Second, "gap %d", i)
			assert.Less(t, d, 11*time.Second, "gap %d", i)
			gaps[d] = true
		}
		assert.Greater(t, len(gaps), 1, "the delays are drawn, not fixed: %v", got)
	})
}

func TestPollerTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var calls []time.Duration
		src := telemetry.SourceFunc(func(ctx context.Context) ([]telemetry.Observation, error) {
			calls = append(calls, time.Since(start))
			<-ctx.Done() // a hung exporter
			return nil, ctx.Err()
		})
		var errs []error
		p, err := telemetry.NewPoller(src, &recorder{}, telemetry.PollerOptions{
			Interval: 10 * time.Second, Timeout: 2 * time.Second, Jitter: -1,
			OnError: func(err error) { errs = append(errs, err) },
		})
		require.NoError(t, err)
		runFor(t, p, 30*time.Second)
		// Each round ends 2s in and backs off: 0 -> 2+20 -> 24+40 (past 30s).
		assert.Equal(t, secs(0, 22), calls)
		assert.Equal(t, telemetry.PollerStats{Rounds: 2, Failures: 2, Timeouts: 2, ConsecutiveFailures: 2}, p.Stats())
		require.Len(t, errs, 2)
		assert.ErrorIs(t, errs[0], context.DeadlineExceeded)
		assert.Contains(t, errs[0].Error(), "telemetry: poll timed out after 2s")
	})
}

// TestPollerCountsAPartialRoundCutByItsTimeout: a target that hangs (a
// node gone down) holds the round until the Timeout while the others
// answered at once; their readings are published that late, so the round
// was cut short by the Timeout although it is partial, not failed. Counted
// only as partial, it left timeouts at 0 while every round ran the full
// Timeout and the fleet's readings arrived that much older.
func TestPollerCountsAPartialRoundCutByItsTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := telemetry.SourceFunc(func(ctx context.Context) ([]telemetry.Observation, error) {
			<-ctx.Done() // b's scrape hangs; a answered
			return []telemetry.Observation{{EndpointID: "a", Sample: sample(time.Time{}, float64(telemetry.Waiting), 1)}},
				fmt.Errorf("%w: endpoint b: %w", telemetry.ErrPartial, ctx.Err())
		})
		var errs []error
		p, err := telemetry.NewPoller(src, &recorder{}, telemetry.PollerOptions{
			Interval: 10 * time.Second, Timeout: 2 * time.Second,
			OnError: func(err error) { errs = append(errs, err) },
		})
		require.NoError(t, err)
		assert.True(t, p.Poll(t.Context()), "a partial result is a success")
		assert.Equal(t, telemetry.PollerStats{Rounds: 1, Timeouts: 1, Partial: 1, Published: 1}, p.Stats())
		require.Len(t, errs, 1)
		assert.ErrorIs(t, errs[0], telemetry.ErrPartial)
		assert.ErrorIs(t, errs[0], context.DeadlineExceeded)
		assert.Contains(t, errs[0].Error(), "telemetry: poll timed out after 2s")
	})
}

func TestPollerStopsDuringCollect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		entered := make(chan struct{})
		src := telemetry.SourceFunc(func(ctx context.Context) ([]telemetry.Observation, error) {
			close(entered)
			<-ctx.Done()
			return nil, ctx.Err()
		})
		p, err := telemetry.NewPoller(src, &recorder{}, telemetry.PollerOptions{Interval: time.Minute})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		<-entered
		assert.ErrorIs(t, p.Run(ctx), telemetry.ErrPollerRunning, "one Run at a time")
		cancel()
		assert.ErrorIs(t, <-done, context.Canceled)
		assert.Zero(t, p.Stats().Failures, "shutting down is not the source's failure")
	})
}

// TestPollerStopsDuringPartialCollect: targets cut short because Run is
// stopping make a partial result that is no fault of theirs, as a whole
// round cut short is none: OnError hears nothing and Partial does not
// count it (a program that stops its Poller would log a "context
// canceled" scrape failure at every shutdown). What did arrive is kept.
func TestPollerStopsDuringPartialCollect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		entered := make(chan struct{})
		src := telemetry.SourceFunc(func(ctx context.Context) ([]telemetry.Observation, error) {
			close(entered)
			<-ctx.Done()
			obs := []telemetry.Observation{{EndpointID: "a", Sample: sample(time.Time{}, float64(telemetry.Waiting), 1)}}
			return obs, fmt.Errorf("%w: 1 of 2 targets failed: %w", telemetry.ErrPartial, ctx.Err())
		})
		var errs []error
		sink := &recorder{}
		p, err := telemetry.NewPoller(src, sink, telemetry.PollerOptions{Interval: time.Minute, OnError: func(err error) { errs = append(errs, err) }})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		<-entered
		cancel()
		assert.ErrorIs(t, <-done, context.Canceled)
		assert.Empty(t, errs, "shutting down is not the targets' failure")
		assert.Zero(t, p.Stats().Partial, "shutting down is not the targets' failure")
		sink.mu.Lock()
		defer sink.mu.Unlock()
		assert.Equal(t, []string{"a"}, sink.ids, "the observation that arrived is published")
	})
}

func TestPollerPublishes(t *testing.T) {
	clock := testutil.NewClock()
	observed := t0.Add(-time.Minute)
	src := telemetry.SourceFunc(func(context.Context) ([]telemetry.Observation, error) {
		return []telemetry.Observation{
			{EndpointID: "a", Sample: sample(time.Time{}, float64(telemetry.Waiting), 1)}, // stamped by the poller
			{EndpointID: "b", Sample: sample(observed, float64(telemetry.Running), 2)},    // keeps its own time
			{EndpointID: "", Sample: sample(observed, float64(telemetry.Running), 3)},     // no endpoint
			{EndpointID: "c"}, // no field
		}, errors.Join(telemetry.ErrPartial, errors.New("one family unreadable"))
	})
	var st telemetry.Store
	p, err := telemetry.NewPoller(src, &st, telemetry.PollerOptions{Clock: clock})
	require.NoError(t, err)
	assert.True(t, p.Poll(t.Context()), "a partial result is a success")

	got, ok := st.Latest("a", clock.Now(), 0)
	require.True(t, ok)
	assert.True(t, got.Time.Equal(testutil.Epoch))
	got, ok = st.Latest("b", clock.Now(), 0)
	require.True(t, ok)
	assert.True(t, got.Time.Equal(observed))
	assert.Equal(t, telemetry.PollerStats{Rounds: 1, Partial: 1, Published: 2, Skipped: 2}, p.Stats())
}

// A source whose clock runs ahead of ours (a Prometheus server) stamps
// samples in our future. Kept as is, such a sample would win over every
// local reading of its fields until our clock caught up, and never look
// stale; the poller reads it as now.
func TestPollerBringsFutureTimesToNow(t *testing.T) {
	clock := testutil.NewClock()
	ahead := clock.Now().Add(time.Hour)
	src := telemetry.SourceFunc(func(context.Context) ([]telemetry.Observation, error) {
		return []telemetry.Observation{{EndpointID: "a", Sample: sample(ahead, float64(telemetry.Waiting), 50)}}, nil
	})
	var st telemetry.Store
	p, err := telemetry.NewPoller(src, &st, telemetry.PollerOptions{Clock: clock})
	require.NoError(t, err)
	require.True(t, p.Poll(t.Context()))
	clock.Advance(time.Second)
	st.Publish("a", sample(clock.Now(), float64(telemetry.Waiting), 0)) // a fresher local reading
	got, ok := st.Latest("a", clock.Now(), 30*time.Second)
	require.True(t, ok)
	v, _ := got.Get(telemetry.Waiting)
	assert.Equal(t, 0.0, v, "the later local reading wins")
}

func TestNewPollerValidates(t *testing.T) {
	src := telemetry.SourceFunc(func(context.Context) ([]telemetry.Observation, error) { return nil, nil })
	tests := []struct {
		name string
		src  telemetry.Source
		sink telemetry.Sink
		opts telemetry.PollerOptions
		want string
	}{
		{"nil source", nil, &recorder{}, telemetry.PollerOptions{}, "Source is nil"},
		{"nil sink", src, nil, telemetry.PollerOptions{}, "Sink is nil"},
		{"negative interval", src, &recorder{}, telemetry.PollerOptions{Interval: -1}, "Interval is -1ns, want >= 0"},
		{"negative timeout", src, &recorder{}, telemetry.PollerOptions{Timeout: -1}, "Timeout"},
		{"negative backoff", src, &recorder{}, telemetry.PollerOptions{MaxBackoff: -1}, "MaxBackoff"},
		{"jitter of 1", src, &recorder{}, telemetry.PollerOptions{Jitter: 1}, "Jitter is 1, want < 1"},
		{"NaN jitter", src, &recorder{}, telemetry.PollerOptions{Jitter: math.NaN()}, "Jitter is NaN"},
		// A bare number is nanoseconds: Interval: 15 meant seconds, and
		// every round timed out after its 5ns Timeout, so no reading ever
		// arrived (only OnError said so).
		{"interval of 15ns", src, &recorder{}, telemetry.PollerOptions{Interval: 15}, "PollerOptions.Interval is 15ns, want 0 (the default) or at least 10ms"},
		{"timeout of 5ns", src, &recorder{}, telemetry.PollerOptions{Timeout: 5}, "PollerOptions.Timeout is 5ns, want 0 (the default) or at least 1ms"},
		{"interval at the floor", src, &recorder{}, telemetry.PollerOptions{Interval: 10 * time.Millisecond}, ""},
		{"interval below the floor", src, &recorder{}, telemetry.PollerOptions{Interval: 9 * time.Millisecond}, "PollerOptions.Interval is 9ms"},
		{"an endpoint picker's 50ms", src, &recorder{}, telemetry.PollerOptions{Interval: 50 * time.Millisecond}, ""},
		{"timeout at the floor", src, &recorder{}, telemetry.PollerOptions{Timeout: time.Millisecond}, ""},
		{"zero value", src, &recorder{}, telemetry.PollerOptions{}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := telemetry.NewPoller(tt.src, tt.sink, tt.opts)
			if tt.want == "" {
				require.NoError(t, err)
				assert.NotNil(t, p)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), "telemetry: ")
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestPollerDefaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &scripted{errs: []error{errDown}, start: time.Now()}
		// Zero options except no jitter: 15s interval, backoff capped at 1m.
		p, err := telemetry.NewPoller(src, &recorder{}, telemetry.PollerOptions{Jitter: -1})
		require.NoError(t, err)
		runFor(t, p, 5*time.Minute)
		assert.Equal(t, secs(0, 30, 90, 150, 210, 270), src.times())
	})
}

// downUntil is a Source that fails until a moment of the bubble's time.
type downUntil struct {
	start time.Time
	up    time.Duration
}

func (s *downUntil) Collect(context.Context) ([]telemetry.Observation, error) {
	if time.Since(s.start) < s.up {
		return nil, errDown
	}
	return []telemetry.Observation{{EndpointID: "a", Sample: sample(time.Time{}, float64(telemetry.Waiting), 1)}}, nil
}

// TestPollerNoticesAFleetBackWithinAMinute: a fleet whose servers all
// refuse scrapes for ten minutes (a rollout of every replica, each loading
// its weights) is read again within a minute of answering. With backoff
// capped at five minutes, the fleet answered at 10m and the poller came
// back at 12m30s: two and a half minutes of routing without telemetry.
func TestPollerNoticesAFleetBackWithinAMinute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recorder{}
		p, err := telemetry.NewPoller(&downUntil{start: time.Now(), up: 10 * time.Minute}, sink, telemetry.PollerOptions{Jitter: -1})
		require.NoError(t, err)
		runFor(t, p, 11*time.Minute)
		sink.mu.Lock()
		defer sink.mu.Unlock()
		assert.NotEmpty(t, sink.got, "no sample within a minute of the fleet's return")
	})
}

// expireAt waits in the bubble until at (since start), then expires the
// process load of ids in st, each of which must hold some.
func expireAt(t *testing.T, st *telemetry.Store, start time.Time, at time.Duration, ids ...string) {
	t.Helper()
	time.Sleep(at - time.Since(start))
	synctest.Wait()
	for _, id := range ids {
		require.True(t, st.Expire(id, telemetry.ProcessLoad, time.Now()), "nothing of %s to expire at %v", id, at)
	}
}

// TestPollerScrapesAgainAfterAnExpiry: a Store that drops readings (a gRPC
// reconnect, which a server's MaxConnectionAge brings every 30 s, or a
// failure exclusion) wakes the Poller publishing into it, which scrapes
// again at once, or MinInterval after its last round started, instead of
// leaving the endpoint without readings until its next Interval. Expiries
// before that round come to one round.
func TestPollerScrapesAgainAfterAnExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		src := &scripted{errs: []error{nil}, start: start}
		var st telemetry.Store
		p, err := telemetry.NewPoller(src, &st, telemetry.PollerOptions{Interval: 10 * time.Second, MinInterval: 2 * time.Second, Jitter: -1})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()

		expireAt(t, &st, start, 5*time.Second, "a") // 5s after the round at 0: a round at once
		time.Sleep(500 * time.Millisecond)
		st.Publish("b", sample(time.Now(), float64(telemetry.Waiting), 1))
		st.Publish("c", sample(time.Now(), float64(telemetry.Running), 1))
		expireAt(t, &st, start, 6*time.Second, "a", "b", "c") // three drops, one round at 5+2
		expireAt(t, &st, start, 8*time.Second, "a")           // a round at 7+2
		time.Sleep(20*time.Second - time.Since(start))
		synctest.Wait()
		cancel()
		assert.ErrorIs(t, <-done, context.Canceled)

		assert.Equal(t, secs(0, 5, 7, 9, 19), src.times(), "then every Interval again")
		assert.Equal(t, uint64(3), p.Stats().Early, "rounds at 5, 7 and 9 s were early")
		got, ok := st.Latest("a", time.Now(), 0)
		require.True(t, ok)
		assert.True(t, got.Time.Equal(start.Add(19*time.Second)))
	})
}

// TestPollerScrapesAgainAfterAnExpiryDuringItsRound: a drop while a round
// runs (its scrape, taken before the reconnect and published after, is
// refused as the old process's) asks for another round.
func TestPollerScrapesAgainAfterAnExpiryDuringItsRound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var st telemetry.Store
		st.Publish("b", sample(start, float64(telemetry.Waiting), 1))
		var calls []time.Duration
		src := telemetry.SourceFunc(func(context.Context) ([]telemetry.Observation, error) {
			calls = append(calls, time.Since(start))
			if len(calls) == 2 {
				time.Sleep(time.Second)
				st.Expire("b", telemetry.ProcessLoad, time.Now())
			}
			return nil, nil
		})
		p, err := telemetry.NewPoller(src, &st, telemetry.PollerOptions{Interval: 10 * time.Second, MinInterval: 3 * time.Second, Jitter: -1})
		require.NoError(t, err)
		runFor(t, p, 25*time.Second)
		assert.Equal(t, secs(0, 10, 13, 23), calls)
		assert.Equal(t, uint64(1), p.Stats().Early, "the round at 13 s")
	})
}

// TestPollerMinIntervalDefault: MinInterval defaults to Interval/4.
func TestPollerMinIntervalDefault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		src := &scripted{errs: []error{nil}, start: start}
		var st telemetry.Store
		p, err := telemetry.NewPoller(src, &st, telemetry.PollerOptions{Interval: 10 * time.Second, Jitter: -1})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		expireAt(t, &st, start, time.Second, "a")
		time.Sleep(5*time.Second - time.Since(start))
		synctest.Wait()
		cancel()
		assert.ErrorIs(t, <-done, context.Canceled)
		assert.Equal(t, secs(0, 2.5), src.times())
	})
}

// TestPollerNegativeMinIntervalRunsNoEarlyRound: a negative MinInterval
// turns early rounds off (a Source read through Prometheus gains nothing
// from them), as a negative Jitter turns jitter off.
func TestPollerNegativeMinIntervalRunsNoEarlyRound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		src := &scripted{errs: []error{nil}, start: start}
		var st telemetry.Store
		p, err := telemetry.NewPoller(src, &st, telemetry.PollerOptions{Interval: 10 * time.Second, MinInterval: -1, Jitter: -1})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		expireAt(t, &st, start, time.Second, "a")
		expireAt(t, &st, start, 12*time.Second, "a")
		time.Sleep(15*time.Second - time.Since(start))
		synctest.Wait()
		cancel()
		assert.ErrorIs(t, <-done, context.Canceled)
		assert.Equal(t, secs(0, 10), src.times())
		assert.Zero(t, p.Stats().Early)
	})
}

// TestPollerBacksOffThroughExpiries: after a failed round, a drop does not
// bring the next one forward: the Source did not answer, and polling it
// at every reconnect of a fleet that is coming back would undo the backoff.
func TestPollerBacksOffThroughExpiries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		src := &scripted{errs: []error{nil, errDown}, start: start}
		var st telemetry.Store
		p, err := telemetry.NewPoller(src, &st, telemetry.PollerOptions{Interval: 10 * time.Second, MinInterval: time.Second, Jitter: -1})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		expireAt(t, &st, start, 12*time.Second, "a") // the round at 10 failed
		time.Sleep(35*time.Second - time.Since(start))
		synctest.Wait()
		cancel()
		assert.ErrorIs(t, <-done, context.Canceled)
		assert.Equal(t, secs(0, 10, 30), src.times())
		assert.Zero(t, p.Stats().Early, "no round ran early")
	})
}

// TestPollerDefaultsKeepReadingsFreshPastAHungTarget: a round publishes
// when its last target answers or the Timeout cuts it, and its readings
// are as old as the round's start. With the Timeout one Interval (the old
// default), one hung target (a node gone down) held every round 15 s: the
// readings of the targets that answered at once arrived 15 s old and the
// next ones 30 s later, so a Balancer (TelemetryMaxAge 30 s, twice the
// default Interval) went without any endpoint's telemetry for half of
// each round, 1,800 of 3,600 s. With the default Timeout, a third of the
// Interval, a reading is at most 2 x 5 + 15 x 1.1 = 26.5 s old when the
// next arrives: never stale.
func TestPollerDefaultsKeepReadingsFreshPastAHungTarget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := telemetry.SourceFunc(func(ctx context.Context) ([]telemetry.Observation, error) {
			<-ctx.Done() // b's scrape hangs; a answered at once
			return []telemetry.Observation{{EndpointID: "a", Sample: sample(time.Time{}, float64(telemetry.Waiting), 1)}},
				fmt.Errorf("%w: endpoint b: %w", telemetry.ErrPartial, ctx.Err())
		})
		var st telemetry.Store
		p, err := telemetry.NewPoller(src, &st, telemetry.PollerOptions{Rand: rand.NewPCG(1, 2)})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		const maxAge = 2 * telemetry.DefaultPollInterval // the Balancer's default TelemetryMaxAge
		stale, first := 0, time.Duration(-1)
		for s := range 3600 {
			time.Sleep(time.Second)
			synctest.Wait()
			_, ok := st.Latest("a", time.Now(), maxAge)
			switch {
			case ok && first < 0:
				first = time.Duration(s+1) * time.Second
			case !ok && first >= 0:
				stale++
			}
		}
		cancel()
		assert.ErrorIs(t, <-done, context.Canceled)
		assert.Equal(t, telemetry.DefaultPollInterval/3, first, "the first round's readings, at its Timeout")
		assert.Zero(t, stale, "seconds without a fresh reading of a once the first arrived")
		assert.Greater(t, p.Stats().Timeouts, uint64(150), "every round timed out (a round each 20 s or so)")
	})
}

// TestPollerJittersItsEarlyRound: a server's restart reconnects every
// client process's connections together, and each one's Poller, woken by
// the expiry, ran its early round at once: every client scraped the whole
// fleet in the same instant. The early round is delayed by up to Jitter x
// MinInterval, drawn from Rand, and still never starts sooner than
// MinInterval after the last round.
func TestPollerJittersItsEarlyRound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		src := &scripted{errs: []error{nil}, start: start}
		var st telemetry.Store
		// Draws in turn: the delay after the round at 0 (u = 0.5: 10 s),
		// the first early round's (u = 0.5: 0.5 x 0.5 x 2 s = 0.5 s), the
		// delay after it (10 s), the second early round's (u = 0.75: 0.75 s).
		p, err := telemetry.NewPoller(src, &st, telemetry.PollerOptions{
			Interval: 10 * time.Second, MinInterval: 2 * time.Second, Jitter: 0.5,
			Rand: testutil.NewScript(1<<63, 1<<63, 1<<63, 3<<62, 1<<63),
		})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()

		expireAt(t, &st, start, 5*time.Second, "a") // would be at once: 5 + 0.5
		expireAt(t, &st, start, 6*time.Second, "a") // MinInterval after 5.5, + 0.75
		time.Sleep(10*time.Second - time.Since(start))
		synctest.Wait()
		cancel()
		assert.ErrorIs(t, <-done, context.Canceled)

		assert.Equal(t, secs(0, 5.5, 8.25), src.times())
		assert.Equal(t, uint64(2), p.Stats().Early)
	})
}
