package grpcbalancer_test

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	core "github.com/inferlb/inferlb/balancer"
)

// failingCreds are per-RPC credentials whose token source fails for the
// calls whose context carries a credsDown error, as when a metadata server
// or an OAuth endpoint is down: gRPC ends those calls with that error (a
// status error keeps its code, any other becomes UNAUTHENTICATED) before
// it creates a stream, on whatever endpoint was picked.
type failingCreds struct{}

type credsDown struct{}

func (failingCreds) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	if err, ok := ctx.Value(credsDown{}).(error); ok {
		return nil, err
	}
	return nil, nil
}

func (failingCreds) RequireTransportSecurity() bool { return false }

// A call that never reached its endpoint says nothing about it: a local
// failure before the stream exists (here the per-RPC credentials) must
// count neither as the endpoint's failure (a token outage would trip every
// breaker and shut the fleet out once the tokens are back) nor as its
// success (an instant "answer" that makes it look fast).
func TestE2ECallNeverSentCountsAsNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		code codes.Code
	}{
		{"status error", status.Error(codes.Unavailable, "token source unreachable"), codes.Unavailable},
		{"plain error", errors.New("token source unreachable"), codes.Unauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bs := fleet(t, 1, nil)
			name, b := shared(t, core.Options{PanicThreshold: -1, OutlierInterval: -1})
			conn, _ := dial(t, bs, name, `{}`, grpc.WithPerRPCCredentials(failingCreds{}))
			client := testgrpc.NewTestServiceClient(conn)
			ctx := testContext(t)
			if _, err := client.EmptyCall(ctx, &testgrpc.Empty{}, grpc.WaitForReady(true)); err != nil {
				t.Fatal(err)
			}
			before := endpointStats(t, b, bs[0].addr)
			down := context.WithValue(ctx, credsDown{}, tc.err)
			for range 2 * core.DefaultBreakerFailures {
				if _, err := client.EmptyCall(down, &testgrpc.Empty{}); status.Code(err) != tc.code {
					t.Fatalf("call without a token: %v, want %v from the credentials", err, tc.code)
				}
			}
			if got := bs[0].calls.Load(); got != 1 {
				t.Fatalf("the backend saw %d calls, want only the first", got)
			}
			s := endpointStats(t, b, bs[0].addr)
			if s.Failures != before.Failures || s.Successes != before.Successes || !s.ExcludedUntil.IsZero() {
				t.Errorf("calls that never left the client counted for the endpoint: failures %d -> %d, successes %d -> %d, excluded until %v",
					before.Failures, s.Failures, before.Successes, s.Successes, s.ExcludedUntil)
			}
			if _, err := client.EmptyCall(ctx, &testgrpc.Empty{}); err != nil {
				t.Errorf("a call once the tokens are back: %v", err)
			}
		})
	}
}
