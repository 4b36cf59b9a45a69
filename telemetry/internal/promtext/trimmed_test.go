package promtext_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb/telemetry/internal/promtext"
)

func TestTrimmedKeepsTheChain(t *testing.T) {
	base := errors.New("base: partial")
	err := fmt.Errorf("%w: pkg: 2 lines skipped", base)
	got := promtext.Trimmed(err, "base: partial: ", "pkg: ")
	assert.EqualError(t, got, "2 lines skipped")
	assert.ErrorIs(t, got, base)
	assert.Same(t, err, promtext.Trimmed(err, "other: "), "nothing to trim: err as it is")
	assert.NoError(t, promtext.Trimmed(nil, "pkg: "))
}
