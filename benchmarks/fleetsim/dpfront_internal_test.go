package fleetsim

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An engine's front end sends a call to the rank of least waiting*4 +
// running as last published, the first such from rank 0, and counts the
// call as waiting there until the next publication.
func TestDPFrontPicksAsVLLM(t *testing.T) {
	e := &dpEngine{}
	for i := range 3 {
		e.ranks = append(e.ranks, &replica{idx: 10 + i})
	}
	f := &dpFront{e: e, counts: [][2]int{{1, 0}, {0, 3}, {0, 4}}} // scores 4, 3, 4
	assert.Equal(t, 11, f.pick())                                 // score 3 -> 7
	assert.Equal(t, 10, f.pick(), "a tie (4, 4) goes to the first rank")
	assert.Equal(t, 12, f.pick())
	assert.Equal(t, [][2]int{{2, 0}, {1, 3}, {1, 4}}, f.counts)
}

// membersRecorder records the members a router is given.
type membersRecorder struct {
	Router
	got *[][]int
}

func (m *membersRecorder) SetMembers(ms []int) {
	*m.got = append(*m.got, slices.Clone(ms))
	m.Router.SetMembers(ms)
}

// A baseline meets a data-parallel fleet as a default vLLM deployment
// shows it: one endpoint per engine, whose front end spreads the calls
// over the engine's ranks; inferlb sees every rank.
func TestBaselinesSeeOneEndpointPerEngine(t *testing.T) {
	t.Parallel()
	sc := DataParallelScenario()
	cfg := RunConfig{Rate: 10, Clients: 1, Seed: 1, Warmup: 10 * time.Second, Duration: 40 * time.Second, Drain: 60 * time.Second}
	var got [][]int
	rec := Policy{Name: "recorder", New: func(e Env) Router {
		return &membersRecorder{Router: RoundRobin().New(e), got: &got}
	}}
	res := Run(sc, rec, cfg)
	require.NotEmpty(t, got)
	for _, m := range got {
		assert.Equal(t, []int{0, 8}, m, "one endpoint per engine, its lowest rank")
	}
	require.Len(t, res.Share, 16)
	for i, sh := range res.Share {
		assert.Positive(t, sh, "share of rank r%d", i)
	}

	got = nil
	lb := InferLB(Variant{Name: "inferlb"})
	seen := Policy{Name: lb.Name, SeesRanks: true, New: func(e Env) Router {
		return &membersRecorder{Router: lb.New(e), got: &got}
	}}
	Run(sc, seen, cfg)
	require.NotEmpty(t, got)
	assert.Len(t, got[0], 16, "every rank")
}
