package balancer

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/inferlb/inferlb"
)

func TestPrefillEstimateDecays(t *testing.T) {
	var p prefillEstimate
	t0 := int64(1_700_000_000) * int64(time.Second)
	if got := p.at(t0); got != 0 {
		t.Fatalf("empty estimate %v", got)
	}
	p.add(t0, 8000)
	for _, c := range []struct {
		after time.Duration
		want  float64
	}{
		{0, 8000},
		{prefillWindow, 8000 / math.E},
		{2 * prefillWindow, 8000 / math.E / math.E},
		{20 * time.Second, 0},
	} {
		if got := p.at(t0 + int64(c.after)); math.Abs(got-c.want) > 0.02*8000 {
			t.Errorf("after %v: %v, want about %v", c.after, got, c.want)
		}
	}
	// A second prompt adds to what is left of the first.
	p.add(t0+int64(prefillWindow), 1000)
	if got, want := p.at(t0+int64(prefillWindow)), 8000/math.E+1000; math.Abs(got-want) > 0.02*8000 {
		t.Errorf("sum %v, want about %v", got, want)
	}
}

func TestPrefillEstimateLosesNothingUnderConcurrency(t *testing.T) {
	var p prefillEstimate
	now := int64(1_700_000_000) * int64(time.Second) // one instant: no decay between adds
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				p.add(now, 1)
			}
		})
	}
	wg.Wait()
	if got := p.at(now); got != 8000 {
		t.Fatalf("8 x 1000 adds of 1 token: %v", got)
	}
}

// Picks read the clock before they add their prompt, so a racing pick with a
// later reading may update first. The estimate must neither be wiped by a
// reading 1 ms older than its stamp (an unsigned age wrapped to 2^32 ms)
// nor lose what the later update added.
func TestPrefillEstimateTakesOutOfOrderTimes(t *testing.T) {
	var p prefillEstimate
	t0 := int64(1_700_000_000) * int64(time.Second)
	p.add(t0+int64(time.Millisecond), 30000) // the racing pick, later reading
	p.add(t0, 1000)                          // this pick, read 1 ms earlier
	if got := p.at(t0 + int64(time.Millisecond)); math.Abs(got-31000) > 620 {
		t.Fatalf("estimate %v, want about 31000", got)
	}
	if got := p.at(t0); math.Abs(got-31000) > 620 {
		t.Fatalf("read 1 ms before the stamp: %v, want about 31000", got)
	}
}

// peerIDs lists the IDs of e's data-parallel engine, sorted; nil for none.
func peerIDs(e *endpoint) []string {
	p := e.dpPeers.Load()
	if p == nil {
		return nil
	}
	var ids []string
	for _, r := range *p {
		ids = append(ids, r.id)
	}
	slices.Sort(ids)
	return ids
}

// TestEnginesAreEachMembershipsOwn: two memberships of a shared Balancer
// (two gRPC channels to two fleets, or a gRPC channel and an HTTP
// transport) may use the same dp_group value for different engines:
// labels are per fleet ("0", "1", ...). Each membership's engines are its
// own; only an endpoint both list joins the ranks each puts it with.
func TestEnginesAreEachMembershipsOwn(t *testing.T) {
	b := New(Options{})
	fleet := func(prefix string, groups ...string) []inferlb.Endpoint {
		var eps []inferlb.Endpoint
		for i, g := range groups {
			eps = append(eps, inferlb.Endpoint{ID: fmt.Sprintf("%s%d", prefix, i), Labels: map[string]string{DefaultDPGroupLabel: g}})
		}
		return eps
	}
	x, err := b.NewMembership()
	if err != nil {
		t.Fatal(err)
	}
	y, err := b.NewMembership()
	if err != nil {
		t.Fatal(err)
	}
	if err := x.Update(fleet("x", "0", "0", "1")); err != nil {
		t.Fatal(err)
	}
	if err := y.Update(fleet("y", "0", "0", "1")); err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"x0": {"x0", "x1"}, "x1": {"x0", "x1"}, "x2": nil, // x2: an engine of one
		"y0": {"y0", "y1"}, "y1": {"y0", "y1"}, "y2": nil,
	}
	check := func(when string) {
		t.Helper()
		for id, w := range want {
			if got := peerIDs(b.eps[id]); !slices.Equal(got, w) {
				t.Errorf("%s: %s's engine is %v, want %v", when, id, got, w)
			}
		}
	}
	check("two fleets")

	// An endpoint both list (the same replica, say by gRPC and by HTTP) is
	// a rank of each engine a membership puts it in, by that membership's
	// own description of it, not the one given last: y puts x2 in its
	// engine "0", x keeps it alone in its "1".
	if err := y.Update(append(fleet("y", "0", "0", "1"), inferlb.Endpoint{ID: "x2", Labels: map[string]string{DefaultDPGroupLabel: "0"}})); err != nil {
		t.Fatal(err)
	}
	want["x2"], want["y0"], want["y1"] = []string{"x2", "y0", "y1"}, []string{"x2", "y0", "y1"}, []string{"x2", "y0", "y1"}
	check("a shared replica")

	x.Close()
	delete(want, "x0")
	delete(want, "x1")
	check("after x closed")
}

// TestPrefillEstimateAfterAClockStepBack: the estimate's stamp never moves
// back for a racing reading; after the clock stepped back an hour it
// stayed an hour ahead, so nothing decayed and what each ended call left
// (the part of its prompt not yet taken out) piled up: a 1,000-token call
// every 100 ms, each ending 200 ms after it began, left 34,000 tokens
// after 10 s and 200,000 after a minute (7x the cost), where the steady
// state is under a thousand.
func TestPrefillEstimateAfterAClockStepBack(t *testing.T) {
	var p prefillEstimate
	now := int64(1e18)
	p.add(now+int64(time.Hour), 1000) // the last call before the step
	for range 600 {
		p.add(now, 1000)
		p.done(now+int64(200*time.Millisecond), now, 1000)
		now += int64(100 * time.Millisecond)
	}
	if got := p.at(now); got > 1000 {
		t.Fatalf("estimate %.0f tokens a minute after the step, want under 1000", got)
	}
}

// TestEnginesFollowUpdates: an Update that regroups ranks moves the
// barrier with them. A rank's recent prefill is its engine's peak only
// while it is a rank of that engine; a rank left alone in its engine (an
// engine of one) has no barrier and is priced by its own recent prefill,
// as an unlabelled endpoint is; a rank removed holds no peak for its old
// mates; and a replica added back under the same ID starts afresh.
func TestEnginesFollowUpdates(t *testing.T) {
	b := New(Options{})
	fleet := func(groups ...string) []inferlb.Endpoint {
		var eps []inferlb.Endpoint
		for i, g := range groups {
			ep := inferlb.Endpoint{ID: fmt.Sprintf("r%d", i)}
			if g != "" {
				ep.Labels = map[string]string{DefaultDPGroupLabel: g}
			}
			eps = append(eps, ep)
		}
		return eps
	}
	const prompt = 8000
	now := int64(1_700_000_000) * int64(time.Second)
	stall := 1 + prompt/float64(dpStallTokens) // a new peak of prompt tokens
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-3 }

	if err := b.Update(fleet("a", "a", "b", "b")); err != nil {
		t.Fatal(err)
	}
	r0 := b.eps["r0"]
	r0.prefill.add(now, prompt) // r0 is prefilling a long prompt
	if got := barrier(b.eps["r1"], prompt, now); !near(got, 1) {
		t.Errorf("r1, r0's mate: barrier %v, want 1 (fills r0's step)", got)
	}
	if got := barrier(b.eps["r2"], prompt, now); !near(got, stall) {
		t.Errorf("r2, other engine: barrier %v, want %v (a new step)", got, stall)
	}

	// r1 moves to engine b; r0 is left an engine of one.
	if err := b.Update(fleet("a", "b", "b", "b")); err != nil {
		t.Fatal(err)
	}
	if !b.engines.Load() {
		t.Fatal("engine b has three ranks: engines are on")
	}
	if got := barrier(b.eps["r1"], prompt, now); !near(got, stall) {
		t.Errorf("r1 after moving to engine b: barrier %v, want %v (r0 is no mate now)", got, stall)
	}
	if got := barrier(r0, prompt, now); !near(got, stall) {
		t.Errorf("r0, an engine of one: barrier %v, want %v (its own step rises by all of it)", got, stall)
	}
	if got, want := prefillBacklog(r0, now), 1+prompt/float64(prefillBacklogTokens); !near(got, want) {
		t.Errorf("r0, an engine of one: prefill backlog factor %v, want %v, as an unlabelled endpoint", got, want)
	}

	// r0 rejoins engine b, then is removed: its prefill is no peak of b's.
	if err := b.Update(fleet("b", "b", "b", "b")); err != nil {
		t.Fatal(err)
	}
	if got := barrier(b.eps["r1"], prompt, now); !near(got, 1) {
		t.Errorf("r1 with r0 in its engine again: barrier %v, want 1", got)
	}
	if err := b.Update(fleet("b", "b", "b", "b")[1:]); err != nil {
		t.Fatal(err)
	}
	if got := barrier(b.eps["r1"], prompt, now); !near(got, stall) {
		t.Errorf("r1 after r0 left: barrier %v, want %v", got, stall)
	}
	if err := b.Update(fleet("b", "b", "b", "b")); err != nil {
		t.Fatal(err)
	}
	if got := b.eps["r0"].prefill.at(now); got != 0 {
		t.Errorf("r0 added back: estimate %v, want 0 (a new process's)", got)
	}
	if got := barrier(b.eps["r1"], prompt, now); !near(got, stall) {
		t.Errorf("r1 after r0 came back: barrier %v, want %v", got, stall)
	}

	// Every label gone: no engines, so priced adds no barrier; each
	// endpoint would be an engine of its own, all alike.
	if err := b.Update(fleet("", "", "", "")); err != nil {
		t.Fatal(err)
	}
	if b.engines.Load() {
		t.Error("no labels: engines still on")
	}
	for id, e := range b.eps {
		if got := barrier(e, prompt, now); !near(got, stall) {
			t.Errorf("%s unlabelled: barrier %v, want %v", id, got, stall)
		}
	}
}

// TestEndedCallsLeaveNoPeak: a call that ended is taken out of its rank's
// estimate, but not always to 0 (float32 rounding; a millisecond stamp
// against a nanosecond start), and what is left decays for about a
// minute before it reaches 0. A leftover is no prefill: it must not make
// a peak that the engine's other ranks fill ahead of an idle engine's.
func TestEndedCallsLeaveNoPeak(t *testing.T) {
	b := New(Options{})
	var eps []inferlb.Endpoint
	for i, g := range []string{"a", "a", "b", "b"} {
		eps = append(eps, inferlb.Endpoint{ID: fmt.Sprintf("r%d", i), Labels: map[string]string{DefaultDPGroupLabel: g}})
	}
	if err := b.Update(eps); err != nil {
		t.Fatal(err)
	}
	// A call on r0 that began on a millisecond and ended 0.9 ms past one:
	// the estimate, stamped in milliseconds, decayed 0.9 ms less than the
	// call's own decay, which is what done takes out.
	now := int64(1_700_000_000) * int64(time.Second)
	r0 := b.eps["r0"]
	r0.prefill.add(now, 8000)
	end := now + int64(40*time.Millisecond) + 900_000
	r0.prefill.done(end, now, 8000)
	later := end + int64(2*time.Second)
	if left := r0.prefill.at(later); left <= 0 || left >= prefillFloor {
		t.Fatalf("the call left %v tokens, want a leftover in (0, %d)", left, prefillFloor)
	}
	for _, tokens := range []int{100, 4000} {
		mate, other := barrier(b.eps["r1"], tokens, later), barrier(b.eps["r2"], tokens, later)
		if mate != other {
			t.Errorf("%d-token prompt: r0's mate costs %v x, the idle engine's rank %v x: a leftover made a peak", tokens, mate, other)
		}
	}
}

// TestEngineLabelIgnoresSurroundingSpace: a dp_group value is trimmed as a
// model label's names are, so "0" and "0 " (a hand-written gRPC attribute,
// a template's trailing space) name one engine rather than splitting its
// ranks into engines of one, priced as if they stepped alone.
func TestEngineLabelIgnoresSurroundingSpace(t *testing.T) {
	b := New(Options{})
	eps := []inferlb.Endpoint{
		{ID: "r0", Labels: map[string]string{DefaultDPGroupLabel: "0"}},
		{ID: "r1", Labels: map[string]string{DefaultDPGroupLabel: "0"}},
		{ID: "r2", Labels: map[string]string{DefaultDPGroupLabel: " 0 "}},
		{ID: "r3", Labels: map[string]string{DefaultDPGroupLabel: " 0 "}},
	}
	if err := b.Update(eps); err != nil {
		t.Fatal(err)
	}
	const prompt = 8000
	now := int64(1_700_000_000) * int64(time.Second)
	b.eps["r0"].prefill.add(now, prompt)
	for _, id := range []string{"r1", "r2", "r3"} {
		if got := barrier(b.eps[id], prompt, now); math.Abs(got-1) > 1e-3 {
			t.Errorf("%s, r0's mate whatever the spaces: barrier %v, want 1 (fills r0's step)", id, got)
		}
	}
}
