package httpbalancer

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/cache"
)

// TestInfoKeepsItsSize: the salt's digest lives in Stream's padding. Info
// is in every call's state (see TestCallStateKeepsItsSizeClass), which has
// no 16 bytes to spare for the salt itself.
func TestInfoKeepsItsSize(t *testing.T) {
	assert.Equal(t, unsafe.Sizeof(inferlb.Request{})+8, unsafe.Sizeof(Info{}))
}

// TestSessionKeyDoesNotAllocate: salting a session header's key costs no
// allocation on the call's path.
func TestSessionKeyDoesNotAllocate(t *testing.T) {
	k := cache.NewKeyer(7)
	info := Info{salt: saltTag(k, "tenant-a")}
	var key uint64
	assert.Zero(t, testing.AllocsPerRun(100, func() { key = info.sessionKey(k, "conv-9") }))
	assert.NotEqual(t, k.Session("conv-9"), key)
	assert.Equal(t, k.Session("conv-9"), (&Info{}).sessionKey(k, "conv-9"))
	assert.NotEqual(t, [3]byte{}, saltTag(k, "tenant-a"))
	assert.NotEqual(t, saltTag(k, "tenant-a"), saltTag(k, "tenant-b"))
	assert.Equal(t, saltTag(k, "tenant-a"), saltTag(cache.NewKeyer(7), "tenant-a"), "one seed, one tag")
}
