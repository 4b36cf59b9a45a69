package grpcbalancer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/grpcbalancer"
	"github.com/inferlb/inferlb/balancer/internal/testhook"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A generation call whose first try a server did not process (a stream
// refused with REFUSED_STREAM, or dropped by a graceful GOAWAY), which
// gRPC retried transparently on a replica whose engine hangs behind its
// live API server (its headers at once, then nothing), and which an
// interceptor inside UnaryOutcome or UnaryRetry gave up after 30 s
// (context.WithCancel and a timer, the caller still waiting), had
// nothing back: Unanswered, as a call given up there without the refused
// try before it is. The refused try ended before gRPC picked the retry,
// so the retry was the invoke's only attempt in flight; the second pick
// made it read as a hedge's loser, answered, and every call whose first
// try met the refusing server left the hung replica unmarked.
func TestE2EHungUnaryAfterATransparentRetryIsUnanswered(t *testing.T) {
	const refusedFirst = 2 // calls whose first try the refusing server saw
	for _, tc := range []struct {
		name   string
		goAway bool
		ic     grpc.UnaryClientInterceptor
	}{
		{"refused stream, UnaryOutcome", false, grpcbalancer.UnaryOutcome()},
		{"graceful goaway, UnaryOutcome", true, grpcbalancer.UnaryOutcome()},
		{"refused stream, UnaryRetry", false, grpcbalancer.UnaryRetry(3)},
		{"graceful goaway, UnaryRetry", true, grpcbalancer.UnaryRetry(3)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			hung := &turning{clock: clock, hung: make(chan struct{})}
			hung.hang.Store(true)
			ref := startRefuser(t, tc.goAway)
			bs := []*backend{{addr: ref.addr}, {addr: serve(t, hung.register)}}
			name, b := shared(t, core.Options{Clock: clock, Rand: testutil.NewRand(1), PanicThreshold: -1, OutlierInterval: -1})
			client, arrived, timers := attemptTimers(t, bs, name, b, tc.ic)
			req := &inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 100, MaxOutputTokens: 100}
			calls, refused := 0, 0
			for refused < refusedFirst {
				require.Less(t, calls, 40, "the refusing server saw the first try of %d of %d calls", refused, calls)
				calls++
				clock.Advance(2 * core.DefaultCooldown) // past the refusal's cooldown
				arrived.drain()
				// A graceful GOAWAY closed the refuser's connection:
				// gRPC connects again on goroutines of its own, and
				// calls picked before it is READY go to the hung
				// replica first. Without -race, 40 calls in a row
				// could all come before it (1 full package run in 5).
				wctx, cancel := context.WithTimeout(testContext(t), 10*time.Second)
				require.NoError(t, testhook.Await(wctx, b, func() bool { return endpointStats(t, b, ref.addr).Ready }),
					"the refusing server is not READY again in 10 s")
				cancel()
				before := ref.streams.Load()
				ended := make(chan error, 1)
				go func() {
					_, err := client.UnaryCall(inferlb.NewContext(testContext(t), req), &testgrpc.SimpleRequest{}, grpc.WaitForReady(true))
					ended <- err
				}()
				timer := <-timers
				select {
				case <-hung.hung:
				case err := <-ended:
					t.Fatalf("call %d ended before it reached the hung replica: %v", calls, err)
				}
				awaitArrival(t, arrived.header, ended) // the headers came: bytes received
				clock.Advance(30 * time.Second)
				timer() // the caller still waits
				assert.Equal(t, codes.Canceled, status.Code(<-ended))
				idle(t, b, "a call given up")
				if ref.streams.Load() > before {
					refused++
				}
			}
			s := endpointStats(t, b, bs[1].addr)
			t.Logf("%d calls, %d of them refused first; the hung replica: unanswered %d, abandoned run %d", calls, refused, s.Unanswered, s.Abandoned)
			assert.EqualValues(t, calls, s.Unanswered, "every call given up on the hung replica with nothing back")
			assert.Zero(t, endpointStats(t, b, bs[0].addr).Unanswered, "the refusing server answered nothing it was asked")
		})
	}
}
