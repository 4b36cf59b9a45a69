package inferlb_test

import (
	"context"
	"fmt"

	"github.com/inferlb/inferlb"
)

// A transport that sees only a context, such as grpc-go's picker (the
// grpcbalancer policy), reads a call's facts from it: the model to route
// to, its tenant, and the tokens it will cost, which the picker cannot read
// from the message. Put them there before the call.
func ExampleNewContext() {
	ctx := inferlb.NewContext(context.Background(), &inferlb.Request{
		Model:           "llama-3-8b",
		Tenant:          "acme",
		PromptTokens:    1200,
		MaxOutputTokens: 256,
		// Service is filled from the method (the policy's "methods") when
		// left unset. With a Request in the context the policy reads no
		// metadata (affinityKeyHeader, tenantHeader, modelHeader): a
		// session goes here too, as AffinityKey with Session set, from a
		// Keyer of the policy's seed (the Balancer's Keyer() for a
		// NewBuilder policy, cache.NewKeyer(seed) for "affinitySeed": seed).
	})
	// ... client.Generate(ctx, msg): the policy picks with these facts ...

	req, ok := inferlb.FromContext(ctx)
	fmt.Println(ok, req.Model, req.Tenant, req.Tokens())
	// Output: true llama-3-8b acme 1456
}
