package balancer

import (
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
)

// pending is 0 with nothing in flight (its doc), however long ago the
// last call ended: a custom scorer reading State.Pending must not see an
// idle endpoint as one with a call out since its last Done.
func TestPendingIsZeroWithNothingInFlight(t *testing.T) {
	var e endpoint
	now := time.Unix(1000, 0).UnixNano()
	e.busySince.Store(now - int64(10*time.Second))
	e.lastDone.Store(now - int64(5*time.Second))
	assert.Zero(t, e.pending(0, now), "idle")
	assert.Equal(t, 5*time.Second, e.pending(1, now), "a call out since the last Done")
}

// prefer passes a candidate over for its client errors only if it is
// marked shunnable (markShunnable): one that found no room under the cap is
// compared on its cost, whatever its share, even beside a marked peer.
func TestPreferPassesOverOnlyAMarkedCandidate(t *testing.T) {
	r := newStayRig(t, 2, Options{})
	nowNs := r.clock.Now().UnixNano()
	marked, unmarked := r.g.members[0], r.g.members[1]
	// marked holds the only room, its share faded since; unmarked's share
	// is high, and it found no room.
	marked.ceShunnable.Store(true)
	r.b.shunnable.Add(1)
	unmarked.ceShare.Store(math.Float64bits(0.9))
	unmarked.ceAt.Store(nowNs)
	// marked is the busier: on cost alone unmarked wins.
	marked.inFlight.Store(3)
	req := &inferlb.Request{Service: inferlb.ServiceEmbedding}
	for range 10 {
		assert.False(t, r.b.prefer(req, r.g, 1, 0, r.clock.Now(), false), "the unmarked, cheaper candidate was passed over")
		assert.True(t, r.b.prefer(req, r.g, 0, 1, r.clock.Now(), false))
	}
}

// A member that found no room to be shunnable looks again at most once a
// second (markShunnable), and at once after the clock stepped back.
func TestShunnableRoomRecheckedOncePerSecond(t *testing.T) {
	for _, tc := range []struct {
		name   string
		after  time.Duration
		marked bool
	}{
		{"half a second later", 500 * time.Millisecond, false},
		{"a second later", time.Second, true},
		{"clock stepped back", -time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newStayRig(t, 2, Options{})
			a, b := r.g.members[0], r.g.members[1]
			for range 20 {
				r.b.noteAnswer(a, r.clock.Now().UnixNano(), true)
			}
			require.True(t, a.ceShunnable.Load())
			for range 20 {
				r.b.noteAnswer(b, r.clock.Now().UnixNano(), true)
			}
			require.False(t, b.ceShunnable.Load(), "no room: the cap is one of two")
			r.b.markShunnable(a, false, r.clock.Now().UnixNano()) // a's room freed
			r.clock.Set(r.clock.Now().Add(tc.after))
			r.b.noteAnswer(b, r.clock.Now().UnixNano(), true)
			assert.Equal(t, tc.marked, b.ceShunnable.Load())
		})
	}
}

// A client-error share under errorRateFloor reads as 0, and an answer that
// takes it under the floor stores 0, so that later clean answers write
// nothing (noteAnswer).
func TestClientErrorShareFloor(t *testing.T) {
	r := newStayRig(t, 1, Options{})
	e := r.g.members[0]
	nowNs := r.clock.Now().UnixNano()
	e.ceShare.Store(math.Float64bits(0.009))
	e.ceAt.Store(nowNs)
	assert.Zero(t, e.clientErrorShare(r.b.cfg, nowNs), "under the floor")
	e.ceShare.Store(math.Float64bits(errorRateFloor * 1.05))
	r.b.noteAnswer(e, nowNs, false)
	assert.Zero(t, e.ceShare.Load(), "a clean answer took the share under the floor: stored as 0")
}

// For a young reading (measured less than lateReading before) the base of
// the calls since it is the in-flight count when a pick first sees it, not
// the history (sinceBase): the calls picked within its first moments err
// towards the reading.
func TestYoungReadingBaseIsTheCountWhenFirstSeen(t *testing.T) {
	const sec = 1_000_000
	atNs := int64(sec)*int64(time.Second) + int64(500*time.Millisecond)
	var e endpoint
	// The history: 1 call in flight before the first pick of the second
	// after the reading's.
	s := histSecond(atNs) + 1
	e.hist[s%inFlightHistory].Store(uint64(s)<<32 | 1)
	var readAt, base atomic.Int64
	young := atNs + int64(1200*time.Millisecond)
	require.Less(t, young-atNs, int64(lateReading))
	n, ok := e.inFlightAfter(atNs, young)
	require.True(t, ok)
	require.Equal(t, int64(1), n, "the history has the count")
	assert.Zero(t, e.sinceBase(&readAt, &base, atNs, 4, young), "young: the base is the count now")

	var readAt2, base2 atomic.Int64
	late := atNs + int64(lateReading) + int64(200*time.Millisecond)
	assert.Equal(t, int64(3), e.sinceBase(&readAt2, &base2, atNs, 4, late), "late: the base is the history's")
}
