package httpbalancer_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

func chatRequest(t *testing.T, i int) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(i, false)))
	require.NoError(t, err)
	return req
}

// TestBaseWithNeitherResponseNorError: a Base that breaks the RoundTripper
// contract with (nil, nil) fails the call, as http.Client does, instead of
// panicking with the pick never reported (the endpoint one call busier for
// good).
func TestBaseWithNeitherResponseNorError(t *testing.T) {
	base := baseFunc(func(r *http.Request) (*http.Response, error) {
		if r.Body != nil {
			_ = r.Body.Close()
		}
		return nil, nil
	})
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{{ID: "a", Addr: "10.0.0.1:80"}, {ID: "b", Addr: "10.0.0.2:80"}},
		Base:      base,
	})
	var err error
	require.NotPanics(t, func() { _, err = tr.RoundTrip(chatRequest(t, 1)) })
	require.ErrorContains(t, err, "nil response")
	assert.Zero(t, totalInFlight(tr.Balancer()))
}
