//go:build race

package testutil

// Race reports whether the race detector is on; heavy statistical tests
// shrink their repetitions under it (they run in full without -race).
const Race = true
