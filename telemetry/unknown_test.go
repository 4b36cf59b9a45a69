package telemetry_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// knownSink is a KnownSink over a Store that knows the IDs it holds, as
// a Balancer is over its Store.
type knownSink struct {
	st    telemetry.Store
	known []string
}

func newKnownSink(ids ...string) *knownSink {
	k := &knownSink{known: ids}
	for _, id := range ids {
		k.st.Hold(id)
	}
	return k
}

func (k *knownSink) Publish(id string, s telemetry.Sample) { k.st.PublishKnown(id, s) }
func (k *knownSink) Known(id string) bool                  { return k.st.Known(id) }

func (k *knownSink) KnownIDs(n int) []string { return k.known[:min(n, len(k.known))] }

var _ telemetry.KnownSink = (*knownSink)(nil)

// rounds is a Source that returns the IDs of rounds[i] on its i-th call
// (the last repeats), one sample each.
type rounds struct {
	mu sync.Mutex
	n  int
	r  [][]string
}

func (s *rounds) Collect(context.Context) ([]telemetry.Observation, error) {
	s.mu.Lock()
	ids := s.r[min(s.n, len(s.r)-1)]
	s.n++
	s.mu.Unlock()
	obs := make([]telemetry.Observation, len(ids))
	for i, id := range ids {
		obs[i] = telemetry.Observation{EndpointID: id, Sample: sample(time.Time{}, float64(telemetry.Waiting), 1)}
	}
	return obs, nil
}

// Targets named by host:port while the Balancer knows its endpoints by
// their IDs: every sample is dropped. The Poller says so through OnError,
// naming some of the unknown and some of the known IDs, once while the
// mistake stays the same and again when it changes; the rounds neither
// fail nor back off.
func TestPollerReportsUnknownEndpoints(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := newKnownSink("vllm-0", "vllm-1", "vllm-2", "vllm-3")
		hostPort := []string{"127.0.0.1:8000", "127.0.0.1:8001", "127.0.0.1:8000", "127.0.0.1:8002", "127.0.0.1:8003"}
		src := &rounds{r: [][]string{
			hostPort, hostPort, // reported once
			{"vllm-0", "vllm-1", "vllm-2", "vllm-3"},             // fixed: nothing to report
			{"vllm-0", "vllm-1", "vllm-2", "vllm-3", "pod-gone"}, // one left while scraped
			{"vllm-0", "vllm-1", "vllm-2", "vllm-3", "pod-gone"}, // the same: not again
			{"vllm-0", "pod-gone", "other"},                      // another count
		}}
		var errs []error
		p, err := telemetry.NewPoller(src, sink, telemetry.PollerOptions{
			Interval: 10 * time.Second, Jitter: -1,
			OnError: func(err error) { errs = append(errs, err) },
		})
		require.NoError(t, err)
		runFor(t, p, 55*time.Second) // rounds at 0, 10, ..., 50 s unless one backs off

		require.Len(t, errs, 3, "%v", errs)
		for _, err := range errs {
			assert.ErrorIs(t, err, telemetry.ErrUnknownEndpoint)
		}
		var ue *telemetry.UnknownEndpointsError
		require.ErrorAs(t, errs[0], &ue)
		assert.Equal(t, 5, ue.Dropped)
		assert.Equal(t, 5, ue.Published)
		assert.Equal(t, []string{"127.0.0.1:8000", "127.0.0.1:8001", "127.0.0.1:8002"}, ue.IDs, "distinct, first 3")
		assert.Equal(t, []string{"vllm-0", "vllm-1", "vllm-2"}, ue.Known)
		assert.Equal(t, `telemetry: 5 of 5 samples dropped: the Sink knows no endpoint "127.0.0.1:8000", "127.0.0.1:8001", "127.0.0.1:8002", ... `+
			`(it knows "vllm-0", "vllm-1", "vllm-2", ...); name each target by its endpoint's Endpoint.Key: the Endpoint.ID, else the Addr exactly as given, scheme included`,
			ue.Error())

		require.ErrorAs(t, errs[1], &ue)
		assert.Equal(t, 1, ue.Dropped)
		assert.Equal(t, 5, ue.Published)
		assert.Equal(t, []string{"pod-gone"}, ue.IDs)
		assert.NotContains(t, ue.Error(), `"pod-gone", ...`, "no more unknown IDs than named")

		require.ErrorAs(t, errs[2], &ue)
		assert.Equal(t, 2, ue.Dropped)
		assert.Equal(t, []string{"pod-gone", "other"}, ue.IDs)

		assert.Equal(t, telemetry.PollerStats{Rounds: 6, Published: 5 + 5 + 4 + 5 + 5 + 3, Unknown: 5 + 5 + 1 + 1 + 2}, p.Stats(),
			"no failure, no partial round, no backoff")
		assert.Equal(t, uint64(14), sink.st.Stats().DroppedUnknown)
	})
}

// The report waits for a change of the first unknown ID too: a target
// fixed while another breaks.
func TestPollerReportsAnotherUnknownEndpoint(t *testing.T) {
	sink := newKnownSink("a", "b")
	src := &rounds{r: [][]string{{"a", "x"}, {"a", "y"}}}
	var errs []error
	p, err := telemetry.NewPoller(src, sink, telemetry.PollerOptions{OnError: func(err error) { errs = append(errs, err) }})
	require.NoError(t, err)
	require.True(t, p.Poll(t.Context()))
	require.True(t, p.Poll(t.Context()))
	require.Len(t, errs, 2)
	assert.ErrorContains(t, errs[0], `no endpoint "x" (it knows "a", "b")`)
	assert.ErrorContains(t, errs[1], `no endpoint "y" (it knows "a", "b")`)
}

// A Sink that knows no endpoint at all says so.
func TestPollerReportsUnknownEndpointsToAnEmptySink(t *testing.T) {
	src := &rounds{r: [][]string{{"a"}}}
	var errs []error
	p, err := telemetry.NewPoller(src, newKnownSink(), telemetry.PollerOptions{OnError: func(err error) { errs = append(errs, err) }})
	require.NoError(t, err)
	require.True(t, p.Poll(t.Context()))
	require.Len(t, errs, 1)
	assert.ErrorContains(t, errs[0], `1 of 1 samples dropped: the Sink knows no endpoint "a" (it knows none)`)
}

type nopSink struct{}

func (nopSink) Publish(string, telemetry.Sample) {}

type nopChecked struct{ nopSink }

func (nopChecked) Known(string) bool     { return true }
func (nopChecked) KnownIDs(int) []string { return nil }

// A round whose IDs are all known allocates nothing but its Timeout's
// context, through a KnownSink as through a plain Sink: the unknown IDs
// are kept on the stack, and no error is built.
func TestPollerKnownRoundAllocatesNothingNew(t *testing.T) {
	obs := []telemetry.Observation{
		{EndpointID: "a", Sample: sample(time.Time{}, float64(telemetry.Waiting), 1)},
		{EndpointID: "b", Sample: sample(time.Time{}, float64(telemetry.Waiting), 2)},
	}
	src := telemetry.SourceFunc(func(context.Context) ([]telemetry.Observation, error) { return obs, nil })
	ctx := t.Context()
	allocs := func(sink telemetry.Sink) float64 {
		p, err := telemetry.NewPoller(src, sink, telemetry.PollerOptions{Clock: testutil.NewClock(), OnError: func(error) {}})
		require.NoError(t, err)
		return testing.AllocsPerRun(100, func() { p.Poll(ctx) })
	}
	timeout := testing.AllocsPerRun(100, func() {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_ = cctx.Err()
		cancel()
	})
	assert.Equal(t, timeout, allocs(nopSink{}), "through a plain Sink")
	assert.Equal(t, timeout, allocs(nopChecked{}), "through a KnownSink")
}

// A Sink that is not a KnownSink (a Store, which keeps every ID) gets
// no such report.
func TestPollerIntoAStoreReportsNoUnknownEndpoint(t *testing.T) {
	var st telemetry.Store
	var errs []error
	p, err := telemetry.NewPoller(&rounds{r: [][]string{{"a"}}}, &st, telemetry.PollerOptions{OnError: func(err error) { errs = append(errs, err) }})
	require.NoError(t, err)
	require.True(t, p.Poll(t.Context()))
	assert.Empty(t, errs)
	assert.Equal(t, 1, st.Len())
}

// wrapped embeds a KnownSink and wraps its Publish, as a program that
// watches what reaches its Balancer does: the Poller still publishes
// through the wrapper's Publish.
type wrapped struct {
	*knownSink
	seen []string
}

func (w *wrapped) Publish(id string, s telemetry.Sample) {
	w.seen = append(w.seen, id)
	w.knownSink.Publish(id, s)
}

func TestPollerPublishesThroughAWrappedKnownSink(t *testing.T) {
	w := &wrapped{knownSink: newKnownSink("a")}
	var errs []error
	p, err := telemetry.NewPoller(&rounds{r: [][]string{{"a", "x"}}}, w, telemetry.PollerOptions{OnError: func(err error) { errs = append(errs, err) }})
	require.NoError(t, err)
	require.True(t, p.Poll(t.Context()))
	assert.Equal(t, []string{"a", "x"}, w.seen, "the wrapper's Publish")
	require.Len(t, errs, 1)
	assert.ErrorContains(t, errs[0], `no endpoint "x" (it knows "a")`)
}

// Store.Known says whether PublishKnown keeps an ID's samples: while it
// has a slot.
func TestStoreKnown(t *testing.T) {
	var st telemetry.Store
	assert.False(t, st.Known("a"))
	st.Hold("a")
	assert.True(t, st.Known("a"))
	st.Release("a")
	assert.False(t, st.Known("a"))
	assert.False(t, st.Known("a"), "asking makes no slot")
	assert.Zero(t, st.Len())
}
