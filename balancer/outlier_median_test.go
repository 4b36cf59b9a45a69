package balancer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// With an even number of endpoints judged, the median success rate is the
// mean of the middle two: of four at 1.0, 1.0, 0.7 and 0.5 the median is
// 0.85, so with the default margin of 0.2 only the endpoint at 0.5 is an
// outlier. The upper middle one alone (1.0) would eject the one at 0.7 as
// well: in a pool of four, half the pool would be out for one bad replica.
func TestOutlierMedianOfAnEvenPoolIsTheMeanOfTheMiddleTwo(t *testing.T) {
	fleet := join(replicas("ok", "", 2, 0), replicas("meh", "", 1, 3), replicas("bad", "", 1, 5))
	ejected, capped := runOutlierInterval(t, fleet)
	assert.Equal(t, []string{"bad-0"}, ejected)
	assert.Empty(t, capped)
}

func join(parts ...[]poolEndpoint) []poolEndpoint {
	var out []poolEndpoint
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}
