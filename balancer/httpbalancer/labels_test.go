package httpbalancer_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

// The Transport re-applies its static endpoints with every change Discovery
// finds, on the discovery goroutine, and Endpoints hands out its endpoints
// as "the caller's". Both shared label maps with the caller: the maps given
// to Update (or Options.Endpoints), which the caller may reuse once the
// call has returned (the Balancer copies them), and the one map every
// discovered endpoint shares, which Endpoints returned as is. A caller's
// later write then changed routing at the next resolution (here: the only
// endpoint serving "llama" lost its label, and calls for it failed), and,
// made while the discovery goroutine applied a set, raced with it (a
// concurrent map read and write is fatal).
func TestEndpointLabelsAreTheTransportsOwn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dns := &fakeDNS{}
		dns.set(nil, "10.0.0.1")
		labels := map[string]string{"model": "llama"}
		tr, err := httpbalancer.NewTransport(httpbalancer.Options{
			Endpoints: []inferlb.Endpoint{{ID: "static", Addr: "10.9.9.9:80", Labels: labels}},
			Discovery: &httpbalancer.Discovery{
				Target:     "vllm.svc:8000",
				Interval:   10 * time.Second,
				Grace:      -1,
				LookupHost: dns.LookupHost,
				Labels:     map[string]string{"model": "embed"},
			},
		})
		require.NoError(t, err)
		defer tr.Close()

		labels["model"] = "something else" // the caller reuses its map
		for _, e := range tr.Endpoints() {
			e.Labels["model"] = "changed by the caller" // "the caller's"
		}
		for _, e := range tr.Endpoints() {
			assert.NotEqual(t, "changed by the caller", e.Labels["model"], e.Key())
		}

		dns.set(nil, "10.0.0.2") // the next resolution re-applies the set
		time.Sleep(10 * time.Second)
		synctest.Wait()
		want := map[string]string{"static": "llama", "10.0.0.2:8000": "embed"}
		got := map[string]string{}
		for _, e := range tr.Endpoints() {
			got[e.Key()] = e.Labels["model"]
		}
		assert.Equal(t, want, got)
		for model, id := range map[string]string{"llama": "static", "embed": "10.0.0.2:8000"} {
			p, err := tr.Balancer().Pick(&inferlb.Request{Model: model})
			require.NoError(t, err, model)
			assert.Equal(t, id, p.ID(), model)
			p.Done(inferlb.Outcome{})
		}
	})
}
