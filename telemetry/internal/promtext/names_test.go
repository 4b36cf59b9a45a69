package promtext

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestNames(t *testing.T) {
	var l Names
	assert.Equal(t, "", l.String())
	assert.Equal(t, "", l.Bracketed())
	l.Add("a")
	assert.Equal(t, ` ("a")`, l.Bracketed())
	l.Add(`b"c`)
	l.Add("d")
	assert.Equal(t, `"a", "b\"c", "d"`, l.String())
	l.Add("e")
	l.Add("f")
	assert.Equal(t, 5, l.Len())
	assert.Equal(t, `"a", "b\"c", "d" and 2 more`, l.String())
}
