package balancer

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
)

// Model names are request data: refusals of made-up names, each its own
// window (and prompt limit), keep at most windowModels models in the
// balancer's gate and windowsPerEndpoint on the endpoint, and the gate's
// last entries still steer.
func TestRememberedWindowsStayBounded(t *testing.T) {
	b := New(Options{})
	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "a", Addr: "a:1"}, {ID: "b", Addr: "b:1"}}))
	e := b.eps["a"]
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	for i := range 4 * windowModels {
		m := "made-up-" + strconv.Itoa(i)
		b.rememberWindow(e, m, 1000+i, i%2 == 1, now)
		now += int64(time.Millisecond)
	}
	require.NotNil(t, b.windows.Load())
	assert.LessOrEqual(t, len(*b.windows.Load()), windowModels)
	assert.LessOrEqual(t, len(*e.windows.Load()), windowsPerEndpoint)
	// The endpoint keeps its latest, and a new model still takes a
	// place there once the gate is full.
	last := "made-up-" + strconv.Itoa(4*windowModels-1)
	assert.EqualValues(t, 1000+4*windowModels-1, e.windowOf(b.modelKey(last)^promptSalt, now))
	b.rememberWindow(e, "real", 4096, false, now)
	assert.EqualValues(t, 4096, e.windowOf(b.modelKey("real"), now))
	assert.LessOrEqual(t, len(*b.windows.Load()), windowModels)
	assert.LessOrEqual(t, len(*e.windows.Load()), windowsPerEndpoint)
}
