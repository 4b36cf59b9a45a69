package httpbalancer

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/cache"
)

// TestMaxResponsesIsHeld: Options.MaxResponses is how many responses the
// Transport remembers, and its doc sizes it as the new responses per
// second times ResponseMemory. The table was rounded down to a power of
// two, so 3,000 asked for held 2,048 at most (180,000 asked for, the
// doc's own example, held 131,072): the follow-ups of the rest lost
// their pin and went where their input's key went, where vLLM and
// SGLang have no stored response for them.
func TestMaxResponsesIsHeld(t *testing.T) {
	const n = 3000
	o := Options{MaxResponses: n}
	c, err := o.resolve()
	require.NoError(t, err)
	r := c.chains
	r.clock = fixedClock{time.Unix(1e9, 0)}
	assert.GreaterOrEqual(t, r.sessions().Cap(), 2*n, "room for two entries per response")
	k := cache.NewKeyer(3)
	for i := range n {
		r.remember(k.Session("resp_"+strconv.Itoa(i)), uint64(i)+1, uint64(i%8)+1)
	}
	found := 0
	for i := range n {
		if key, serial, ok := r.lookup(k.Session("resp_" + strconv.Itoa(i))); ok && key == uint64(i)+1 && serial == uint32(i%8)+1 {
			found++
		}
	}
	// The table is set-associative: a set can fill before the table does
	// (here about 9% of responses lose an entry that way).
	assert.GreaterOrEqual(t, found, n*85/100, "responses remembered of %d", n)
}
