package httpbalancer

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestCallStateKeepsItsSizeClass guards the one allocation per call (see
// call): 640 bytes is a size class of Go's allocator, and the next is 704.
// A field added to call, or to balancer.Pick inside it, that crosses it
// costs every call 64 bytes more (BenchmarkTransportOverhead's B/op).
func TestCallStateKeepsItsSizeClass(t *testing.T) {
	assert.LessOrEqual(t, int(callHeader), 640, "call with its allocation header")
}
