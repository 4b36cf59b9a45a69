package grpcbalancer

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"

	"github.com/inferlb/inferlb"
)

// membership is the endpoint list the policy last gave its Balancer.
func (h *harness) membership() map[string]inferlb.Endpoint {
	lb := h.lb()
	lb.mu.Lock()
	defer lb.mu.Unlock()
	out := map[string]inferlb.Endpoint{}
	for _, e := range lb.eps {
		out[e.Addr] = e
	}
	return out
}

// TestConfigEndpointsDescribeResolverAddresses: with a resolver that says
// nothing but addresses (DNS, passthrough), the config's "endpoints" give
// each address its ID, weight and labels, matched however the resolver
// spells the address (an IP address in another notation, a name in
// another case, a port with a leading zero); a config push alone changes
// them; an address without an entry keeps its defaults; and a
// WithEndpoint description wins whole over the entry for its address.
func TestConfigEndpointsDescribeResolverAddresses(t *testing.T) {
	cfg := `{"modelHeader": "x-model", "endpoints": {
		"10.0.0.0:50051": {"labels": {"model": "llama-8b"}},
		"[fd00::1]:50051": {"id": "replica-1", "weight": 2, "labels": {"model": "llama-70b,llama-70b-lora", "version": "3"}},
		"llm-2.internal:50051": {"labels": {"model": "llama-70b"}},
		"10.0.0.9:50051": {"labels": {"model": "not-listed"}}
	}}`
	eps := []resolver.Endpoint{
		{Addresses: []resolver.Address{{Addr: "10.0.0.0:50051"}}},
		{Addresses: []resolver.Address{{Addr: "[fd00:0:0::1]:050051"}}},
		{Addresses: []resolver.Address{{Addr: "LLM-2.internal:50051"}}},
		{Addresses: []resolver.Address{{Addr: "10.0.0.3:50051"}}},
	}
	h := newHarnessWith(t, Name, cfg, eps)
	got := h.membership()
	assert.Equal(t, inferlb.Endpoint{ID: "10.0.0.0:50051", Addr: "10.0.0.0:50051", Labels: map[string]string{"model": "llama-8b"}}, got["10.0.0.0:50051"])
	assert.Equal(t, inferlb.Endpoint{ID: "replica-1", Addr: "[fd00:0:0::1]:050051", Weight: 2,
		Labels: map[string]string{"model": "llama-70b,llama-70b-lora", "version": "3"}}, got["[fd00:0:0::1]:050051"])
	assert.Equal(t, map[string]string{"model": "llama-70b"}, got["LLM-2.internal:50051"].Labels)
	assert.Equal(t, inferlb.Endpoint{ID: "10.0.0.3:50051", Addr: "10.0.0.3:50051"}, got["10.0.0.3:50051"], "no entry: the defaults")

	// Routing follows the labels: a llama-70b-lora call goes only to the
	// endpoint that lists it, or to the one without a model label (the
	// core's rule: an unlabelled endpoint serves any model).
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-model", "llama-70b-lora")
	for range 50 {
		a, res := h.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: ctx})
		if a != "[fd00:0:0::1]:050051" && a != "10.0.0.3:50051" {
			t.Fatalf("a llama-70b-lora call went to %s", a)
		}
		res.Done(sent)
	}

	// A config push alone (same resolver state) changes the description.
	cfg2 := strings.Replace(cfg, `"llama-8b"`, `"mistral-7b"`, 1)
	parsed, err := parseConfig(json.RawMessage(cfg2), nil)
	require.NoError(t, err)
	h.cfg = parsed
	h.updateEndpoints(eps)
	assert.Equal(t, map[string]string{"model": "mistral-7b"}, h.membership()["10.0.0.0:50051"].Labels)

	// WithEndpoint wins whole: its ID and labels, none of the entry's.
	eps[1] = WithEndpoint(eps[1], inferlb.Endpoint{Labels: map[string]string{"model": "qwen"}})
	h.updateEndpoints(eps)
	for h.cc.ConnectAll() > 0 {
	}
	assert.Equal(t, inferlb.Endpoint{ID: "[fd00:0:0::1]:050051", Addr: "[fd00:0:0::1]:050051",
		Labels: map[string]string{"model": "qwen"}}, h.membership()["[fd00:0:0::1]:050051"])
}

// TestConfigEndpointOfSeveralAddresses: an endpoint with several addresses
// (dual stack) takes the entry of the smallest address that has one, in
// whichever order the resolver lists them, so its ID and labels do not
// change from one answer to the next.
func TestConfigEndpointOfSeveralAddresses(t *testing.T) {
	c, err := parseConfig(json.RawMessage(`{"endpoints": {
		"10.0.0.1:80": {"id": "v4"}, "[fd00::1]:80": {"id": "v6"}}}`), nil)
	require.NoError(t, err)
	a, b := resolver.Address{Addr: "10.0.0.1:80"}, resolver.Address{Addr: "[fd00::1]:80"}
	for _, addrs := range [][]resolver.Address{{a, b}, {b, a}} {
		ep := resolver.Endpoint{Addresses: addrs}
		assert.Equal(t, "v4", endpointOf(ep, c).ID)
		assert.Equal(t, "v4", endpointID(ep, c))
	}
	ep := resolver.Endpoint{Addresses: []resolver.Address{{Addr: "10.0.0.2:80"}, b}}
	assert.Equal(t, "v6", endpointID(ep, c), "the one address with an entry")
	// A unix socket or an address without a port has no entry.
	assert.Equal(t, "unix:///run/x.sock", endpointID(resolver.Endpoint{Addresses: []resolver.Address{{Addr: "unix:///run/x.sock"}}}, c))
}

// TestParseConfigEndpoints: each way an "endpoints" entry can be wrong
// fails at parse time, naming the entry by its address and the field.
func TestParseConfigEndpoints(t *testing.T) {
	for _, tc := range []struct{ js, want string }{
		{`{"endpoints": [1]}`, `field endpoints: got JSON array, want an object`},
		{`{"endpoints": {"10.0.0.1:80": 3}}`, `field endpoints["10.0.0.1:80"]: got JSON number, want an object`},
		{`{"endpoints": {"10.0.0.1:80": {}, "10.0.0.2:80": {"weight": "2"}}}`, `field endpoints["10.0.0.2:80"].weight: got JSON string, want a number`},
		// A label's value of the wrong type names the label, as a
		// method's names the method; labels that are no object, the map.
		{`{"endpoints": {"10.0.0.1:80": {"labels": {"model": 3}}}}`, `field endpoints["10.0.0.1:80"].labels["model"]: got JSON number, want a string`},
		{`{"endpoints": {"10.0.0.1:80": {"labels": {"model": "a"}}, "10.0.0.2:80": {"LABELS": {"model": "b", "dp_group": 0}}}}`, `field endpoints["10.0.0.2:80"].labels["dp_group"]: got JSON number, want a string`},
		{`{"endpoints": {"10.0.0.1:80": {"labels": [1]}}}`, `field endpoints["10.0.0.1:80"].labels: got JSON array, want an object`},
		{`{"endpoints": {"10.0.0.1:80": {"modle": "llama"}}}`, `field endpoints["10.0.0.1:80"]: unknown field "modle" (want id, weight or labels)`},
		{`{"endpoints": {"10.0.0.1": {}}}`, `field endpoints["10.0.0.1"]: want an address as the resolver gives it, host:port`},
		{`{"endpoints": {"llm:http": {}}}`, `field endpoints["llm:http"]: want an address`},
		{`{"endpoints": {"llm:0": {}}}`, `field endpoints["llm:0"]: want an address`},
		{`{"endpoints": {":80": {}}}`, `field endpoints[":80"]: want an address`},
		{`{"endpoints": {"a b:80": {}}}`, `field endpoints["a b:80"]: want an address`},
		{`{"endpoints": {"10.0.0.1:80": {"weight": -1}}}`, `field endpoints["10.0.0.1:80"].weight: -1 is not a finite non-negative number`},
		{`{"endpoints": {"10.0.0.1:80": {"weight": 2e6}}}`, `field endpoints["10.0.0.1:80"].weight: 2e+06 is above MaxWeight`},
		{`{"endpoints": {"10.0.0.1:80": {"id": "a\nb"}}}`, `field endpoints["10.0.0.1:80"].id: "a\nb" has control characters`},
		{`{"endpoints": {"10.0.0.1:80": {"labels": {"": "llama"}}}}`, `field endpoints["10.0.0.1:80"].labels: a label needs a name`},
		// A label name with a control character matches no label the
		// balancer or a Scorer reads: a typo, refused as in an id.
		{`{"endpoints": {"10.0.0.1:80": {"labels": {"model\n": "llama"}}}}`, `field endpoints["10.0.0.1:80"].labels["model\n"]: a label name has no control characters`},
		{`{"endpoints": {"10.0.0.1:80": {"labels": {"dp\u007fgroup": "0"}}}}`, `field endpoints["10.0.0.1:80"].labels["dp\x7fgroup"]: a label name has no control characters`},
		// Two spellings of one address, and exact repeats, which
		// encoding/json would merge silently.
		{`{"endpoints": {"LLM:80": {}, "llm:080": {}}}`, `field endpoints["llm:080"]: the same address as endpoints["LLM:80"] (llm:80)`},
		{`{"endpoints": {"[::ffff:10.0.0.1]:80": {}, "10.0.0.1:80": {}}}`, `the same address as endpoints["10.0.0.1:80"]`},
		{`{"endpoints": {"10.0.0.1:80": {}, "10.0.0.1:80": {}}}`, `field endpoints["10.0.0.1:80"]: duplicate key: each address may appear once`},
		{`{"endpoints": {"10.0.0.1:80": {"labels": {"model": "a", "model": "b"}}}}`, `field endpoints["10.0.0.1:80"].labels["model"]: duplicate key: each label may appear once`},
		{`{"endpoints": {"10.0.0.1:80": {"id": "a", "ID": "b"}}}`, `field endpoints["10.0.0.1:80"].id: duplicate key "ID"`},
		{`{"endpoints": {}, "endpoints": {}}`, `field endpoints: duplicate key`},
	} {
		_, err := parseConfig([]byte(tc.js), nil)
		if err == nil {
			t.Errorf("parseConfig(%s) succeeded", tc.js)
			continue
		}
		if !strings.HasPrefix(err.Error(), "inferlb: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseConfig(%s) = %q, want the inferlb prefix and %q", tc.js, err, tc.want)
		}
	}

	// Bounded: a config the resolver pushes to every client.
	var sb strings.Builder
	sb.WriteString(`{"endpoints": {`)
	for i := range MaxConfigEndpoints + 1 {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `"10.%d.%d.1:80": {}`, i/256, i%256)
	}
	sb.WriteString(`}}`)
	_, err := parseConfig([]byte(sb.String()), nil)
	assert.ErrorContains(t, err, "field endpoints: 4097 entries, more than MaxConfigEndpoints (4096)")
	labels := make([]string, MaxConfigLabels+1)
	for i := range labels {
		labels[i] = fmt.Sprintf(`"l%d": "v"`, i)
	}
	_, err = parseConfig([]byte(`{"endpoints": {"10.0.0.1:80": {"labels": {`+strings.Join(labels, ",")+`}}}}`), nil)
	assert.ErrorContains(t, err, `field endpoints["10.0.0.1:80"].labels: 65 labels, more than MaxConfigLabels (64)`)

	// The same label in two entries, and a null entry, are fine; so is a
	// label value with a control character, as Update takes it (the core
	// trims the spaces, tabs and newlines around each of "model"'s names).
	c, err := parseConfig([]byte(`{"endpoints": {"10.0.0.1:80": {"labels": {"model": "a"}}, "10.0.0.2:80": {"labels": {"model": "a\n", "note": "x\ty"}}, "10.0.0.3:80": null}}`), nil)
	require.NoError(t, err)
	assert.Len(t, c.endpoints, 3)
	assert.Equal(t, map[string]string{"model": "a\n", "note": "x\ty"}, c.endpoints["10.0.0.2:80"].labels)
}
