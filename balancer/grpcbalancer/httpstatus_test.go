package grpcbalancer_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/grpcbalancer"
	"github.com/inferlb/inferlb/balancer/internal/testhook"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A proxy in front of the model server that is not gRPC-aware (a gateway
// with a rate limit) answers HTTP 429, which gRPC maps to UNAVAILABLE with
// "unexpected HTTP status code received from server: 429 (Too Many
// Requests)". That is an overload answer, as the HTTP transport reads a
// 429 and as RESOURCE_EXHAUSTED is: the endpoint cools down. Counted as a
// failure, a rate limit tripped the endpoint's breaker and ejected it.
func TestE2EHTTP429FromAProxyIsAnOverload(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Protocols: &protocols,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// Read the request first. Answered before the client has
			// written its message, the call is one grpc-go reports to the
			// balancer as a success (see outcome): 1 run in 15 under
			// load, before this read.
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte("slow down\n"))
		}),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	addr := lis.Addr().String()
	name, b := shared(t, core.Options{})
	conn, _ := dial(t, []*backend{{addr: addr}}, name, `{}`)
	client := testgrpc.NewTestServiceClient(conn)
	ctx := testContext(t)
	_, err = client.EmptyCall(ctx, &testgrpc.Empty{})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "429") {
		t.Fatalf("a call answered HTTP 429: %v, want UNAVAILABLE naming 429", err)
	}
	s := stats(t, b, addr)
	if s.Failures != 0 || s.Overloads != 1 || s.ExcludedUntil.IsZero() {
		t.Errorf("after an HTTP 429: %d failures, %d overloads, excluded until %v; want 0, 1 and a cooldown", s.Failures, s.Overloads, s.ExcludedUntil)
	}
}

// Triton sheds load with UNAVAILABLE: "Exceeds maximum queue size" when a
// model's queue (dynamic batching's max_queue_size) is full, and "Request
// timeout expired" when a request waited in it past the queue policy's
// timeout. Both are overload answers: the endpoint cools down, its
// breaker and error rate do not count them. Counted as failures, a busy
// Triton tripped its breaker and was ejected after five, and a fleet under
// load lost its replicas one by one. Any other UNAVAILABLE a server sends
// (a crashed backend) stays a failure; "Request for unknown model" is no
// failure either (see TestE2ETritonUnknownModelIsNotServed).
func TestE2ETritonQueueRejectionIsAnOverload(t *testing.T) {
	for _, tc := range []struct {
		msg        string
		overloaded bool
	}{
		{"Exceeds maximum queue size", true},
		{"Request timeout expired", true},
		{"Stub process 'llm_0_0' is not healthy.", false},
	} {
		t.Run(tc.msg, func(t *testing.T) {
			be := &backend{reject: status.Error(codes.Unavailable, tc.msg)}
			be.start(t)
			name, b := shared(t, core.Options{BreakerFailures: 5})
			conn, _ := dial(t, []*backend{be}, name, `{}`)
			client := testgrpc.NewTestServiceClient(conn)
			ctx := testContext(t)
			_, err := client.EmptyCall(ctx, &testgrpc.Empty{})
			if status.Code(err) != codes.Unavailable || status.Convert(err).Message() != tc.msg {
				t.Fatalf("the call ended %v, want the server's UNAVAILABLE %q", err, tc.msg)
			}
			s := stats(t, b, be.addr)
			if tc.overloaded {
				if s.Failures != 0 || s.Overloads != 1 || s.ExcludedUntil.IsZero() {
					t.Errorf("%d failures, %d overloads, excluded until %v; want 0, 1 and a cooldown", s.Failures, s.Overloads, s.ExcludedUntil)
				}
				return
			}
			if s.Failures != 1 || s.Overloads != 0 {
				t.Errorf("%d failures, %d overloads; want 1 and 0", s.Failures, s.Overloads)
			}
		})
	}
}

// A server that throttles its clients the way gRFC A6 describes answers
// UNAVAILABLE (the code retry policies retry) with a pushback in the
// trailer: it answered, and asked for a pause. Counted as failures, such
// answers tripped its breaker (ejected for 10s and more, doubling) where
// it asked for 300ms, as an HTTP 503 with Retry-After does not. Without
// a pushback an UNAVAILABLE stays a failure.
func TestE2EUnavailableWithPushbackIsAnOverload(t *testing.T) {
	for _, tc := range []struct {
		name     string
		trailer  metadata.MD
		cooldown time.Duration // 0: a failure
	}{
		{"grpc-retry-pushback-ms", metadata.Pairs("grpc-retry-pushback-ms", "300"), 300 * time.Millisecond},
		{"do not retry", metadata.Pairs("grpc-retry-pushback-ms", "-1"), time.Second}, // DefaultCooldown
		{"retry-after", metadata.Pairs("retry-after", "2"), 2 * time.Second},
		{"no pushback", metadata.Pairs("x-other", "1"), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := &backend{reject: status.Error(codes.Unavailable, "throttled"), rejectTrailer: tc.trailer}
			be.start(t)
			clock := testutil.NewClock()
			name, b := shared(t, core.Options{Clock: clock, BreakerFailures: 1})
			conn, _ := dial(t, []*backend{be}, name, `{}`)
			client := testgrpc.NewTestServiceClient(conn)
			start := clock.Now()
			_, err := client.EmptyCall(testContext(t), &testgrpc.Empty{})
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("the call ended %v, want the server's UNAVAILABLE", err)
			}
			s := stats(t, b, be.addr)
			if tc.cooldown == 0 {
				if s.Failures != 1 || s.Overloads != 0 {
					t.Errorf("%d failures, %d overloads; want 1 and 0", s.Failures, s.Overloads)
				}
				return
			}
			if s.Failures != 0 || s.Overloads != 1 || s.BreakerOpen {
				t.Errorf("%d failures, %d overloads, breaker open %v; want 0, 1 and closed", s.Failures, s.Overloads, s.BreakerOpen)
			}
			if got := s.ExcludedUntil.Sub(start); got != tc.cooldown {
				t.Errorf("cooled down for %v, want %v", got, tc.cooldown)
			}
		})
	}
}

// Triton answers a call for a model it has not loaded (explicit model
// control: each server loads some of the repository) "Request for unknown
// model: 'llm' is not found", NOT_FOUND in recent releases and
// UNAVAILABLE in older ones ("... has no available versions" while it
// loads). Counted as a success (NOT_FOUND), the server looked like the
// fastest for that model; as a failure (UNAVAILABLE), five tripped the
// breaker of a server that serves its own models well. With the model in
// the call's metadata (modelHeader), the first such answer is the only
// one: the model's later calls go to the server that has it, and the
// server's breaker and error rate do not count it. The same with the
// model in an inferlb.Request in the call's context (inferlb.NewContext),
// which the policy once read for the pick but not for the report, so
// that every such call met the server without the model.
func TestE2ETritonUnknownModelIsNotServed(t *testing.T) {
	for _, tc := range []struct {
		code    codes.Code
		fromCtx bool
	}{{codes.NotFound, false}, {codes.Unavailable, false}, {codes.NotFound, true}} {
		code := tc.code
		t.Run(fmt.Sprintf("%v/context=%v", code, tc.fromCtx), func(t *testing.T) {
			lacking := &backend{reject: status.Error(code, "Request for unknown model: 'llm' is not found")}
			lacking.start(t)
			serving := &backend{}
			serving.start(t)
			name, b := shared(t, core.Options{BreakerFailures: 2, Rand: testutil.NewRand(11)})
			conn, _ := dial(t, []*backend{lacking, serving}, name, `{"modelHeader": "x-model"}`)
			allReady(t, conn, b, 2)
			client := testgrpc.NewTestServiceClient(conn)
			ctx := metadata.AppendToOutgoingContext(testContext(t), "x-model", "llm")
			if tc.fromCtx {
				ctx = inferlb.NewContext(testContext(t), &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llm"})
			}
			// Calls until one meets the server without the model (the
			// draws decide when: on a loaded machine all of a fixed 20
			// once went to the other), then 19 more.
			failed, calls, after := 0, 0, 0
			for ; after < 19 && calls < 1000; calls++ {
				if failed > 0 {
					after++
				}
				if _, err := client.EmptyCall(ctx, &testgrpc.Empty{}); err != nil {
					require.Equal(t, code, status.Code(err), "the server's answer reaches the caller")
					failed++
				}
			}
			s := stats(t, b, lacking.addr)
			assert.Equal(t, 1, failed, "one call met the server without the model")
			assert.Equal(t, uint64(1), s.NotServed)
			assert.Zero(t, s.Failures)
			assert.False(t, s.BreakerOpen)
			assert.Equal(t, int64(calls-1), serving.calls.Load())
		})
	}
}

// With UnaryRetry installed, a call that meets a server without its model
// goes on to another: of five Triton servers, one has the model, and every
// call succeeds (each retry passes over the servers met before: the last
// by the call's own exclusion, the earlier by the Balancer's memory).
func TestE2EUnaryRetryGoesPastUnknownModel(t *testing.T) {
	var lacking []*backend
	serving := &backend{}
	bs := []*backend{serving}
	for range 4 {
		be := &backend{reject: status.Error(codes.NotFound, "Request for unknown model: 'llm' is not found")}
		lacking = append(lacking, be)
		bs = append(bs, be)
	}
	client, b := retryClient(t, bs, core.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(3)}, `{"modelHeader": "x-model"}`, 5)
	ctx := metadata.AppendToOutgoingContext(testContext(t), "x-model", "llm")
	for i := range 20 {
		_, err := client.EmptyCall(ctx, &testgrpc.Empty{})
		require.NoError(t, err, "call %d", i)
	}
	assert.Equal(t, int64(20), serving.calls.Load())
	var met int64
	for _, be := range lacking {
		met += be.calls.Load()
		s := stats(t, b, be.addr)
		assert.LessOrEqual(t, s.NotServed, uint64(1), "each server without the model met once at most")
		assert.Zero(t, s.Failures)
	}
	assert.LessOrEqual(t, met, int64(4))
}

// TestE2EFailingModelKeepsTheServerForOthers: three Triton servers serve
// models x and y, each call taking 5 ms; x's backend crashed on the first,
// which answers x's calls INTERNAL at once (Triton's "Stub process is not
// healthy") while it serves y. With the model in the call's metadata, x's
// failures there are held against x, not the server: its breaker stays
// closed, y's calls keep going there, and after five failures (more when
// the first of them land before y's calls there end) x's calls pass it
// over.
func TestE2EFailingModelKeepsTheServerForOthers(t *testing.T) {
	a := &backend{delay: 5 * time.Millisecond, reject: status.Error(codes.Internal, "Failed to process the request(s) for model instance 'x_0', message: Stub process is not healthy."), rejectModel: "x"}
	a.start(t)
	b2, c := &backend{delay: 5 * time.Millisecond}, &backend{delay: 5 * time.Millisecond}
	b2.start(t)
	c.start(t)
	name, b := shared(t, core.Options{Rand: testutil.NewRand(5)})
	conn, _ := dial(t, []*backend{a, b2, c}, name, `{"modelHeader": "x-model"}`)
	allReady(t, conn, b, 3)
	client := testgrpc.NewTestServiceClient(conn)
	call := func(model string) error {
		_, err := client.EmptyCall(metadata.AppendToOutgoingContext(testContext(t), "x-model", model), &testgrpc.Empty{})
		return err
	}
	// The fleet serves for a while before x breaks: every server has
	// served y.
	for i := 0; a.calls.Load() == 0 || b2.calls.Load() == 0 || c.calls.Load() == 0; i++ {
		require.Less(t, i, 200, "y's calls reach every server")
		require.NoError(t, call("y"))
	}
	before := a.calls.Load()
	var xFailed atomic.Int64
	var g errgroup.Group
	for range 6 {
		g.Go(func() error {
			for range 40 {
				if err := call("y"); err != nil {
					return err
				}
				if err := call("x"); err != nil {
					if status.Code(err) != codes.Internal {
						return err
					}
					xFailed.Add(1)
				}
			}
			return nil
		})
	}
	require.NoError(t, g.Wait(), "y never fails; x's failures are the server's INTERNAL")
	s := stats(t, b, a.addr)
	yOnA := a.calls.Load() - before - xFailed.Load()
	t.Logf("y calls on the server failing x: %d of 240; x calls failed: %d of 240; held against x: %d, against the server: %d", yOnA, xFailed.Load(), s.ModelFailures, s.Failures)
	assert.LessOrEqual(t, xFailed.Load(), int64(12), "x's calls stop going where x fails")
	assert.Positive(t, s.ModelFailures)
	assert.Zero(t, s.Trips)
	assert.False(t, s.BreakerOpen)
	assert.GreaterOrEqual(t, yOnA, int64(40), "y keeps using the server (its share is 80)")
}

// retryClient starts bs and returns a client of a channel over them
// through the inferlb policy, on a Balancer of opts shared with the test,
// with cfg as its config and UnaryRetry(maxAttempts), once every backend
// is ready.
func retryClient(t *testing.T, bs []*backend, opts core.Options, cfg string, maxAttempts int) (testgrpc.TestServiceClient, *core.Balancer) {
	t.Helper()
	for _, be := range bs {
		be.start(t)
	}
	name, b := shared(t, opts)
	conn, _ := dial(t, bs, name, cfg, grpc.WithChainUnaryInterceptor(grpcbalancer.UnaryRetry(maxAttempts)))
	allReady(t, conn, b, len(bs))
	return testgrpc.NewTestServiceClient(conn), b
}

// served is the calls that reached bs, all told.
func served(bs []*backend) (n int64) {
	for _, c := range counts(bs) {
		n += c
	}
	return n
}

// allReady connects conn and waits until the n endpoints of b are ready:
// a test whose calls must find every backend (a model on one of them) may
// not start while some still connect. It looks again each time the policy marks an
// endpoint ready or not (testhook), not on a timer, and fails the test
// after 10s.
//
// conn must not have connected yet. A Membership starts its endpoints
// ready, and the policy marks the unconnected ones not ready right after
// its Update: a look in between would see all ready. So the first look
// comes before Connect, when the policy has no endpoints yet, and every
// later one after a wake, the first of which is the policy marking an
// endpoint not ready after that Update.
func allReady(t *testing.T, conn *grpc.ClientConn, b *core.Balancer, n int) {
	t.Helper()
	connect := sync.OnceFunc(conn.Connect)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := testhook.Await(ctx, b, func() bool {
		defer connect() // once the hook is in place and the first look taken
		ready := 0
		for _, s := range b.Stats() {
			if s.Ready {
				ready++
			}
		}
		return ready == n
	})
	if err != nil {
		t.Fatalf("the endpoints did not all connect in 10s: %+v", b.Stats())
	}
}

// A server that follows Google's API design (AIP-194) says how long to
// wait in the status itself: a google.rpc.RetryInfo detail, which grpc-go
// carries in grpc-status-details-bin (no trailer a client reads). Ignored,
// a RESOURCE_EXHAUSTED asking for 7s cooled the endpoint down for
// DefaultCooldown (1s), and the calls that came back to it after 1s met
// the same refusal; an UNAVAILABLE asking for a pause was a failure, and
// tripped the breaker of a server that was throttling its clients.
func TestE2ERetryInfoIsThePushback(t *testing.T) {
	withRetryInfo := func(code codes.Code, d *durationpb.Duration) error {
		st, err := status.New(code, "quota exceeded").WithDetails(&errdetails.RetryInfo{RetryDelay: d})
		require.NoError(t, err)
		return st.Err()
	}
	for _, tc := range []struct {
		name     string
		reject   error
		cooldown time.Duration
	}{
		{"resource exhausted", withRetryInfo(codes.ResourceExhausted, durationpb.New(7*time.Second)), 7 * time.Second},
		{"unavailable", withRetryInfo(codes.Unavailable, durationpb.New(300*time.Millisecond)), 300 * time.Millisecond},
		{"unavailable without a delay", withRetryInfo(codes.Unavailable, nil), time.Second},                   // DefaultCooldown
		{"negative delay", withRetryInfo(codes.ResourceExhausted, durationpb.New(-time.Second)), time.Second}, // no hint
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := &backend{reject: tc.reject}
			be.start(t)
			clock := testutil.NewClock()
			name, b := shared(t, core.Options{Clock: clock, BreakerFailures: 1, MaxCooldown: time.Minute})
			conn, _ := dial(t, []*backend{be}, name, `{}`)
			client := testgrpc.NewTestServiceClient(conn)
			start := clock.Now()
			_, err := client.EmptyCall(testContext(t), &testgrpc.Empty{})
			if status.Code(err) != status.Code(tc.reject) {
				t.Fatalf("the call ended %v, want the server's %v", err, status.Code(tc.reject))
			}
			s := stats(t, b, be.addr)
			if s.Failures != 0 || s.Overloads != 1 || s.BreakerOpen {
				t.Errorf("%d failures, %d overloads, breaker open %v; want 0, 1 and closed", s.Failures, s.Overloads, s.BreakerOpen)
			}
			if got := s.ExcludedUntil.Sub(start); got != tc.cooldown {
				t.Errorf("cooled down for %v, want %v", got, tc.cooldown)
			}
		})
	}
}
