package errtext_test

import (
	"errors"
	"io/fs"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb/internal/errtext"
)

func TestRewordedKeepsTheError(t *testing.T) {
	err := errtext.Reworded(&fs.PathError{Op: "open", Path: "x", Err: fs.ErrNotExist}, "config file x is missing")
	assert.EqualError(t, err, "config file x is missing")
	assert.ErrorIs(t, err, fs.ErrNotExist)
	var pe *fs.PathError
	assert.True(t, errors.As(err, &pe))
	assert.Equal(t, "x", pe.Path)
}
