package grpcbalancer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/grpcbalancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// turning serves grpc.testing.TestService/UnaryCall as a generation
// server that answers in a second (on the test's clock) until hang is
// set, and from then on sends its headers at once and nothing more until
// the call ends, signalling hung once it has sent them: an engine hung
// behind its live API server.
type turning struct {
	clock  *testutil.Clock
	hang   atomic.Bool
	served atomic.Int64
	hung   chan struct{}
}

func (s *turning) register(srv *grpc.Server) { registerUnaryAsStream(srv, s.handle) }

func (s *turning) handle(ss grpc.ServerStream) error {
	if err := ss.RecvMsg(new(testgrpc.SimpleRequest)); err != nil {
		return err
	}
	if !s.hang.Load() {
		s.clock.Advance(time.Second) // the answer's generation
		s.served.Add(1)
		return ss.SendMsg(&testgrpc.SimpleResponse{Username: "answer"})
	}
	if err := ss.SendHeader(metadata.Pairs("x-engine", "hung")); err != nil {
		return err
	}
	select {
	case s.hung <- struct{}{}:
	case <-ss.Context().Done():
	}
	<-ss.Context().Done()
	return ss.Context().Err()
}

// A replica whose engine hangs behind its live API server (its headers
// at once, then nothing), called through UnaryOutcome or UnaryRetry with
// an interceptor inside that gives each attempt 30 s (context.WithCancel
// and a timer, which ends the attempt CANCELLED while the caller's
// context lives), stops drawing the calls of the session key it owns.
// Its first two calls after the hang are given up by the timeout with
// nothing back, Unanswered: the run that marks it unanswering. It takes
// the key's next call (nothing is out to it), and while that one is out
// the key's 8 calls after it go to its peer. Before, an attempt that an
// interceptor inside ours cancelled after its headers read as answered:
// every call of the key landed on the hung replica, each waiting out its
// timeout.
func TestE2EHungUnaryBehindAnInnerPerAttemptCancelIsUnanswered(t *testing.T) {
	const later = 8
	for _, tc := range []struct {
		name string
		ic   grpc.UnaryClientInterceptor
	}{{"UnaryOutcome", grpcbalancer.UnaryOutcome()}, {"UnaryRetry", grpcbalancer.UnaryRetry(3)}} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			servers := []*turning{{clock: clock, hung: make(chan struct{})}, {clock: clock, hung: make(chan struct{})}}
			bs := make([]*backend, len(servers))
			for i, s := range servers {
				bs[i] = &backend{addr: serve(t, s.register)}
			}
			name, b := shared(t, core.Options{Clock: clock, Rand: testutil.NewRand(1)})
			// Every endpoint READY: the key's owner is ready for its first call.
			client, arrived, timers := attemptTimers(t, bs, name, b, tc.ic)
			req := &inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: 0x5eed, Session: true, PromptTokens: 100, MaxOutputTokens: 100}
			// start makes one call with the key. When it lands on a hung
			// server it returns once the call has its headers, with the
			// attempt's timer and the call's end; when it is answered, nil.
			start := func() (func(), chan error) {
				t.Helper()
				ended := make(chan error, 1)
				go func() {
					_, err := client.UnaryCall(inferlb.NewContext(testContext(t), req), &testgrpc.SimpleRequest{}, grpc.WaitForReady(true))
					ended <- err
				}()
				timer := <-timers
				select {
				case <-servers[0].hung:
				case <-servers[1].hung:
				case err := <-ended:
					require.NoError(t, err)
					arrived.drain()
					return nil, nil
				}
				awaitArrival(t, arrived.header, ended) // the headers came: bytes received
				arrived.drain()
				return timer, ended
			}
			// giveUp fires a hung call's timer after its 30 s.
			giveUp := func(timer func(), ended chan error) {
				t.Helper()
				clock.Advance(30 * time.Second)
				timer() // the caller still waits
				assert.Equal(t, codes.Canceled, status.Code(<-ended))
			}

			// The key's owner answers its calls in a second each. Then
			// its engine hangs.
			owner := -1
			for range 3 {
				before := servers[0].served.Load()
				timer, _ := start()
				require.Nil(t, timer)
				owner = 1
				if servers[0].served.Load() > before {
					owner = 0
				}
			}
			servers[owner].hang.Store(true)
			landed := 0
			for range 2 {
				timer, ended := start()
				if timer != nil {
					landed++
					giveUp(timer, ended)
					idle(t, b, "a call given up")
				}
			}
			s := endpointStats(t, b, bs[owner].addr)
			t.Logf("the hang's first 2 calls: %d landed on the hung replica; unanswered %d, abandoned run %d", landed, s.Unanswered, s.Abandoned)
			// One more is out to it, then the key's next calls.
			out, outEnded := start()
			if out != nil {
				landed++
			}
			moved := 0
			for range later {
				if timer, ended := start(); timer != nil {
					landed++
					giveUp(timer, ended)
				} else {
					moved++
				}
			}
			if out != nil {
				giveUp(out, outEnded)
			}
			idle(t, b, "the calls given up")
			s = endpointStats(t, b, bs[owner].addr)
			t.Logf("%d of %d calls landed on the hung replica, %d of the %d while one was out went to its peer; unanswered %d, abandoned run %d",
				landed, 3+later, moved, later, s.Unanswered, s.Abandoned)
			assert.Equal(t, 3, landed, "calls that landed on the hung replica")
			assert.Equal(t, later, moved, "calls that went to its peer while one was out to it")
			assert.EqualValues(t, 3, s.Unanswered)
			assert.EqualValues(t, 3, s.Abandoned)
		})
	}
}

// attemptTimers dials bs with balancer name (b's) through ic and, inside
// it, an interceptor that gives each attempt a timer the test fires: the
// attempt's cancel (context.WithCancel, which ends the attempt CANCELLED
// while the caller's context lives) comes on timers as the attempt
// starts. arrived signals the calls' headers and messages. It returns
// once every endpoint is READY.
func attemptTimers(t *testing.T, bs []*backend, name string, b *core.Balancer, ic grpc.UnaryClientInterceptor) (client testgrpc.TestServiceClient, arrived *arrivals, timers chan context.CancelFunc) {
	t.Helper()
	arrived = &arrivals{header: make(chan struct{}, 1), payload: make(chan struct{}, 1)}
	timers = make(chan context.CancelFunc, 1)
	perAttempt := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		actx, cancel := context.WithCancel(ctx)
		defer cancel()
		timers <- cancel // the attempt's timer: the test fires it
		return invoker(actx, method, req, reply, cc, opts...)
	}
	conn, _ := dial(t, bs, name, `{"methods": {"/grpc.testing.TestService/": "llm"}}`,
		grpc.WithStatsHandler(arrived), grpc.WithChainUnaryInterceptor(ic, perAttempt))
	allReady(t, conn, b, len(bs))
	return testgrpc.NewTestServiceClient(conn), arrived, timers
}
