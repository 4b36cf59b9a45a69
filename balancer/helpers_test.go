package balancer_test

import (
	"sort"

	"github.com/inferlb/inferlb/scoring"
)

type scoringScorer = scoring.Scorer

func sortStrings(s []string) { sort.Strings(s) }
