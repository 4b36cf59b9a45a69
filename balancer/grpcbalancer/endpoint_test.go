package grpcbalancer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/attributes"
	"google.golang.org/grpc/resolver"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/grpcbalancer"
)

// What WithEndpoint attaches compares by value under
// attributes.Attributes.Equal, as gRPC compares attributes: two resolver
// updates that describe a replica alike (a fresh map of equal labels
// included) are equal, and any difference in ID, Weight or Labels, or the
// description missing on one side, is not. A pointer compared by identity
// would make every update a change.
func TestWithEndpointAttributesCompareByValue(t *testing.T) {
	base := resolver.Endpoint{Addresses: []resolver.Address{{Addr: "10.0.0.1:50051"}}}
	info := inferlb.Endpoint{ID: "r0", Weight: 2, Labels: map[string]string{"model": "llama", "version": "3"}}
	attrs := func(i inferlb.Endpoint) *attributes.Attributes { return grpcbalancer.WithEndpoint(base, i).Attributes }
	same := attrs(info)
	for _, tc := range []struct {
		name  string
		other *attributes.Attributes
		equal bool
	}{
		{"same description", attrs(inferlb.Endpoint{ID: "r0", Weight: 2, Labels: map[string]string{"version": "3", "model": "llama"}}), true},
		{"other ID", attrs(inferlb.Endpoint{ID: "r1", Weight: 2, Labels: info.Labels}), false},
		{"other weight", attrs(inferlb.Endpoint{ID: "r0", Weight: 1, Labels: info.Labels}), false},
		{"other label", attrs(inferlb.Endpoint{ID: "r0", Weight: 2, Labels: map[string]string{"model": "llama", "version": "4"}}), false},
		{"fewer labels", attrs(inferlb.Endpoint{ID: "r0", Weight: 2, Labels: map[string]string{"model": "llama"}}), false},
		{"no description", base.Attributes, false},
		{"another value under another key", attributes.New("k", "v"), false},
	} {
		assert.Equal(t, tc.equal, same.Equal(tc.other), tc.name)
		assert.Equal(t, tc.equal, tc.other.Equal(same), "%s, the other way round", tc.name)
	}
	// Labels are copied: the caller changing its map later changes nothing.
	labels := map[string]string{"model": "llama"}
	before := attrs(inferlb.Endpoint{ID: "r0", Labels: labels})
	labels["model"] = "mistral"
	assert.True(t, before.Equal(attrs(inferlb.Endpoint{ID: "r0", Labels: map[string]string{"model": "llama"}})))
}

// NewBuilder panics, as documented, without a name or a Balancer: either
// is a programming error that no channel could recover from.
func TestNewBuilderNeedsANameAndABalancer(t *testing.T) {
	const msg = "inferlb: grpcbalancer.NewBuilder needs a name and a Balancer"
	assert.PanicsWithValue(t, msg, func() { grpcbalancer.NewBuilder("", core.New(core.Options{})) })
	assert.PanicsWithValue(t, msg, func() { grpcbalancer.NewBuilder("inferlb-x", nil) })
	assert.Equal(t, "inferlb-x", grpcbalancer.NewBuilder("inferlb-x", core.New(core.Options{})).Name())
}
