package balancer_test

import (
	"sort"

	"github.com/inferlb/inferlb/scoring"
)

// Tests that take a second or more under the race detector call
// t.Parallel, so that CI's -race run of this package, which came within
// a minute of go test's 10-minute limit on a loaded machine, runs them on
// both cores. The testing package starts parallel tests only once every
// other test of the binary (internal tests included) has returned, so
// those others may still set package state (countedGroup), check for
// leaked goroutines (goleak) or count allocations (AllocsPerRun); a
// parallel test does none of these, and shares with the others nothing
// but values no test changes.

type scoringScorer = scoring.Scorer

func sortStrings(s []string) { sort.Strings(s) }
