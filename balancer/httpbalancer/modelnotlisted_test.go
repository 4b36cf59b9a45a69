package httpbalancer_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

// A call for a model no endpoint lists says so, names the model and where
// to look; one for a listed model whose endpoints are all out of rotation
// says that instead. Both used to read "no endpoint serves it, or each
// that does is out of rotation", and a typo looked like an outage.
func TestModelNoEndpointListsIsNamed(t *testing.T) {
	served := 0
	tr := newTransport(t, httpbalancer.Options{
		Endpoints:       []inferlb.Endpoint{{Addr: "10.0.0.5:8000", Labels: map[string]string{"model": "llama"}}},
		BalancerOptions: balancer.Options{PanicThreshold: -1},
		Base: baseFunc(func(r *http.Request) (*http.Response, error) {
			served++
			return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}},
				Body: io.NopCloser(strings.NewReader(`{"choices":[]}`)), Request: r}, nil
		}),
	})
	client := &http.Client{Transport: tr}
	call := func(model string) error {
		resp, err := client.Post(chatURL, "application/json", strings.NewReader(`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return err
	}
	require.NoError(t, call("llama"))
	require.Equal(t, 1, served)

	err := call("lama")
	require.ErrorIs(t, err, balancer.ErrModelNotListed)
	assert.Contains(t, err.Error(), `no endpoint lists the requested model: "lama"`)
	assert.Contains(t, err.Error(), "model labels")
	assert.NotContains(t, err.Error(), "out of rotation")

	tr.Balancer().SetReady("10.0.0.5:8000", false)
	err = call("llama")
	require.ErrorIs(t, err, balancer.ErrNoEndpoints)
	assert.NotErrorIs(t, err, balancer.ErrModelNotListed)
	assert.Contains(t, err.Error(), `for model "llama": each endpoint that may serve it is out of rotation`)
	assert.Equal(t, 1, served, "no failed call reached the Base")
}
