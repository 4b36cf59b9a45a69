package balancer

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
)

// The bounded-load check reads a group's in-flight counter. A group of one
// membership counts the calls of every membership on its members, and the
// counts survive another membership's update and Close.
func TestGroupLoadsCountEveryMembershipsCalls(t *testing.T) {
	b := New(Options{})
	a, err := b.NewMembership()
	require.NoError(t, err)
	c, err := b.NewMembership()
	require.NoError(t, err)
	require.NoError(t, a.Update([]inferlb.Endpoint{{ID: "x", Addr: "10.0.0.1:1"}, {ID: "y", Addr: "10.0.0.2:1"}}))
	require.NoError(t, c.Update([]inferlb.Endpoint{{ID: "y", Addr: "10.0.0.2:1"}}))
	load := func(s *Membership) int64 { return s.snap.Load().all.load.Load() }

	var held []Pick
	for range 3 {
		p, err := a.PickExcept(&inferlb.Request{}, "x")
		require.NoError(t, err)
		held = append(held, p)
	}
	assert.EqualValues(t, 3, load(a))
	assert.EqualValues(t, 3, load(c), "c's group does not count a's calls on y")
	require.NoError(t, a.Update([]inferlb.Endpoint{{ID: "x", Addr: "10.0.0.1:1"}}))
	assert.EqualValues(t, 0, load(a), "y left a, and its calls with it")
	assert.EqualValues(t, 3, load(c))
	a.Close()
	assert.EqualValues(t, 3, load(c))
	for i := range held {
		held[i].Done(inferlb.Outcome{})
	}
	assert.EqualValues(t, 0, load(c))
}
