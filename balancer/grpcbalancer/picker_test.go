package grpcbalancer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v3orcapb "github.com/cncf/xds/go/xds/data/orca/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/internal/testutil/grpcfake"
	"github.com/inferlb/inferlb/scoring"
	"github.com/inferlb/inferlb/telemetry"
)

var sent = balancer.DoneInfo{BytesSent: true, BytesReceived: true}

// stats returns the core's view of endpoint a.
func stats(t testing.TB, b *core.Balancer, a string) core.EndpointStats {
	t.Helper()
	for _, s := range b.Stats() {
		if s.ID == a {
			return s
		}
	}
	t.Fatalf("no endpoint %s in %+v", a, b.Stats())
	return core.EndpointStats{}
}

func TestPickSpreadsAndReportsOnce(t *testing.T) {
	h := newHarness(t, Name, `{}`, 4)
	counts := map[string]int{}
	for range 400 {
		a, res := h.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z"})
		counts[a]++
		res.Done(sent)
		res.Done(sent) // a duplicate must not count twice
	}
	if len(counts) != 4 {
		t.Fatalf("picks reached %d of 4 endpoints: %v", len(counts), counts)
	}
	b := h.lb().core.Load()
	var picks, successes uint64
	for _, s := range b.Stats() {
		picks += s.Picks
		successes += s.Successes
		if s.InFlight != 0 {
			t.Errorf("%s: %d calls still in flight after Done", s.ID, s.InFlight)
		}
	}
	if picks != 400 || successes != 400 {
		t.Errorf("core saw %d picks and %d successes, want 400 each", picks, successes)
	}
}

func TestStateSurvivesResolverUpdates(t *testing.T) {
	h := newHarness(t, Name, `{}`, 3)
	b := h.lb().core.Load()
	var held []balancer.PickResult
	for range 30 {
		_, res := h.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z"})
		held = append(held, res)
	}
	before := b.Stats()

	// Same set again: no core update at all; then one more endpoint.
	h.update(3)
	h.update(4)
	if got := h.lb().core.Load(); got != b {
		t.Fatal("a resolver update replaced the core Balancer")
	}
	if s := stats(t, b, addr(3)); s.Ready {
		t.Error("a new endpoint is ready in the core before its SubConn connected")
	}
	for _, s := range before {
		after := stats(t, b, s.ID)
		if after.Picks != s.Picks || after.InFlight != s.InFlight {
			t.Errorf("%s: picks %d -> %d, in flight %d -> %d across updates", s.ID, s.Picks, after.Picks, s.InFlight, after.InFlight)
		}
	}
	for h.cc.ConnectAll() > 0 {
	}
	if s := stats(t, b, addr(3)); !s.Ready {
		t.Error("the new endpoint is not ready after its SubConn connected")
	}
	for _, res := range held {
		res.Done(sent)
	}
}

func TestNotReadyEndpointIsNotPicked(t *testing.T) {
	h := newHarness(t, Name, `{}`, 4)
	b := h.lb().core.Load()
	// The connection to endpoint 0 drops: pickfirst goes IDLE, then
	// endpointsharding asks it to reconnect (its SubConn then waits in
	// Connect, which the fake never completes here).
	h.subConn(addr(0)).SetState(balancer.SubConnState{ConnectivityState: connectivity.Idle})
	if stats(t, b, addr(0)).Ready {
		t.Fatal("endpoint 0 is still ready in the core after its connection dropped")
	}
	for range 200 {
		a, res := h.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z"})
		if a == addr(0) {
			t.Fatal("picked the endpoint whose connection dropped")
		}
		res.Done(sent)
	}
}

func TestNoReadyEndpoint(t *testing.T) {
	cc := grpcfake.NewClientConn()
	bal := balancer.Get(Name).Build(cc, balancer.BuildOptions{})
	defer bal.Close()
	if err := bal.UpdateClientConnState(balancer.ClientConnState{ResolverState: resolver.State{Endpoints: endpoints(2)}}); err != nil {
		t.Fatal(err)
	}
	if st := cc.State().ConnectivityState; st != connectivity.Connecting {
		t.Fatalf("state %v before any connection, want CONNECTING", st)
	}
	info := balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: context.Background()}
	if _, err := cc.State().Picker.Pick(info); err != balancer.ErrNoSubConnAvailable {
		t.Fatalf("Pick while connecting: %v, want ErrNoSubConnAvailable (queue the call)", err)
	}
	refused := errors.New("connection refused")
	for _, sc := range cc.SubConns() {
		sc.SetState(balancer.SubConnState{ConnectivityState: connectivity.Connecting})
		sc.SetState(balancer.SubConnState{ConnectivityState: connectivity.TransientFailure, ConnectionError: refused})
	}
	if st := cc.State().ConnectivityState; st != connectivity.TransientFailure {
		t.Fatalf("state %v with every connection failing, want TRANSIENT_FAILURE", st)
	}
	_, err := cc.State().Picker.Pick(info)
	if err == nil || !strings.HasPrefix(err.Error(), "inferlb: ") || !errors.Is(err, refused) {
		t.Fatalf("Pick in TRANSIENT_FAILURE: %v, want the last connection error with the inferlb prefix", err)
	}
	if _, ok := status.FromError(err); ok {
		t.Fatal("a status error would end wait-for-ready calls instead of queueing them")
	}
}

func TestResolverErrorBeforeAnyEndpoint(t *testing.T) {
	cc := grpcfake.NewClientConn()
	bal := balancer.Get(Name).Build(cc, balancer.BuildOptions{})
	defer bal.Close()
	bal.ResolverError(errors.New("no such host"))
	if st := cc.State().ConnectivityState; st != connectivity.TransientFailure {
		t.Fatalf("state %v, want TRANSIENT_FAILURE", st)
	}
	_, err := cc.State().Picker.Pick(balancer.PickInfo{Ctx: context.Background()})
	if err == nil || !strings.Contains(err.Error(), "inferlb: name resolver error: no such host") {
		t.Fatalf("Pick: %v, want the resolver's error", err)
	}
}

// ClientConn.Connect calls the policy's ExitIdle: with no endpoint to wake
// it must leave the resolver's error in place, not publish
// endpointsharding's "no children to pick from".
func TestExitIdleBeforeAnyEndpoint(t *testing.T) {
	cc := grpcfake.NewClientConn()
	bal := balancer.Get(Name).Build(cc, balancer.BuildOptions{})
	defer bal.Close()
	err := bal.UpdateClientConnState(balancer.ClientConnState{})
	require.ErrorIs(t, err, balancer.ErrBadResolverState)
	bal.ExitIdle()
	assert.Equal(t, connectivity.TransientFailure, cc.State().ConnectivityState)
	_, err = cc.State().Picker.Pick(balancer.PickInfo{Ctx: context.Background()})
	assert.ErrorContains(t, err, "inferlb: name resolver error: produced zero addresses")
}

// A first update with no endpoints is a resolver error: the channel fails
// calls with it, and gRPC re-resolves.
func TestFirstUpdateWithoutEndpoints(t *testing.T) {
	cc := grpcfake.NewClientConn()
	bal := balancer.Get(Name).Build(cc, balancer.BuildOptions{})
	defer bal.Close()
	noAddr := []resolver.Endpoint{{}} // an endpoint without an address is none
	for _, eps := range [][]resolver.Endpoint{nil, noAddr} {
		err := bal.UpdateClientConnState(balancer.ClientConnState{ResolverState: resolver.State{Endpoints: eps}})
		require.ErrorIs(t, err, balancer.ErrBadResolverState, "gRPC re-resolves on this error")
		assert.Equal(t, connectivity.TransientFailure, cc.State().ConnectivityState)
		_, err = cc.State().Picker.Pick(balancer.PickInfo{Ctx: context.Background()})
		assert.ErrorContains(t, err, "inferlb: name resolver error: produced zero addresses")
	}
}

// A resolver update with no endpoints after some (a DNS answer with no
// records for a moment, a flap) is a resolver error (grpc-go's own
// pick_first would drop its connections; see doc.go): the channel keeps its endpoints, their
// connections and their live state in the core, breaker and slow start
// included, and keeps routing; gRPC re-resolves. Before, the update
// removed every endpoint: calls failed until the resolver answered again,
// every connection was dropped and made again, and the endpoints came back
// with their breakers closed, their counters zeroed and ramping up.
func TestEmptyResolverUpdateKeepsTheEndpoints(t *testing.T) {
	h := newHarness(t, Name, `{}`, 2)
	b := h.lb().core.Load()
	// Trip endpoint 0's breaker: it fails calls in a row.
	serial, ok := b.Serial(addr(0))
	require.True(t, ok)
	for range core.DefaultBreakerFailures {
		p, err := h.lb().mem.PickAt(&inferlb.Request{}, serial)
		require.NoError(t, err)
		p.Done(inferlb.Outcome{Err: errors.New("down")})
	}
	before := stats(t, b, addr(0))
	require.True(t, before.BreakerOpen, "endpoint 0's breaker should be open: %+v", before)
	subConns := len(h.cc.SubConns())

	err := h.bal.UpdateClientConnState(balancer.ClientConnState{BalancerConfig: h.cfg})
	require.ErrorIs(t, err, balancer.ErrBadResolverState, "gRPC re-resolves on this error")
	assert.Equal(t, connectivity.Ready, h.cc.State().ConnectivityState)
	a, res := h.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z"}) // fails the test on error
	assert.Equal(t, addr(1), a, "picked the endpoint whose breaker is open")
	res.Done(sent)
	h.bal.ResolverError(errors.New("no such host"))
	assert.Equal(t, connectivity.Ready, h.cc.State().ConnectivityState, "a resolver error with READY endpoints")

	h.update(2) // the same endpoints again
	for _, sc := range h.cc.SubConns() {
		assert.False(t, sc.IsShutdown(), "%s: a connection was closed across the flap", sc.Addr())
	}
	assert.Len(t, h.cc.SubConns(), subConns, "connections made again across the flap")
	if got := h.lb().core.Load(); got != b {
		t.Fatal("the flap replaced the core")
	}
	after := stats(t, b, addr(0))
	assert.True(t, after.BreakerOpen, "the flap closed endpoint 0's breaker")
	assert.Equal(t, before.Trips, after.Trips)
	assert.Equal(t, before.Failures, after.Failures, "the flap reset endpoint 0's counters")
	assert.Equal(t, 1.0, stats(t, b, addr(1)).RampFactor, "endpoint 1 ramps up again after the flap")
	for range 20 {
		a, res := h.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z"})
		assert.Equal(t, addr(1), a, "picked the endpoint whose breaker is open")
		res.Done(sent)
	}
}

// recorder is a scorer that remembers the requests it priced.
type recorder struct {
	mu   sync.Mutex
	last inferlb.Request
	n    int
}

func (r *recorder) Cost(req *inferlb.Request, s scoring.State) float64 {
	r.mu.Lock()
	r.last = *req
	r.n++
	r.mu.Unlock()
	return float64(s.InFlight)
}

func (r *recorder) get() inferlb.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

var builderSeq atomic.Int64

// registerShared registers a NewBuilder policy around b under a fresh name.
func registerShared(b *core.Balancer) string {
	name := fmt.Sprintf("inferlb-test-%d", builderSeq.Add(1))
	balancer.Register(NewBuilder(name, b))
	return name
}

func TestRequestFacts(t *testing.T) {
	rec := &recorder{}
	scorers := map[inferlb.Service]scoring.Scorer{}
	for s := range inferlb.NumServices {
		scorers[inferlb.Service(s)] = rec
	}
	// Affinity off: every pick then reaches the scorer, which records it.
	b := core.New(core.Options{Scorers: scorers, Affinity: core.AffinityOff})
	name := registerShared(b)
	h := newHarness(t, name, `{
		"methods": {"/ai.Gen/": "llm", "/ai.Emb/Embed": "embedding"},
		"defaultService": "rerank",
		"affinityKeyHeader": "X-Session",
		"tenantHeader": "x-tenant", "modelHeader": "x-model"}`, 3)
	keyer := b.Keyer() // keys must share the core's seed, so placement agrees

	md := metadata.Pairs("x-session", "conv-7", "x-tenant", "acme", "x-model", "llama")
	fromCtx := &inferlb.Request{Service: inferlb.ServiceEmbedding, Tenant: "ctx", PromptTokens: 10}
	noSvc := &inferlb.Request{Tenant: "ctx2"}
	tests := []struct {
		name   string
		method string
		ctx    context.Context
		want   inferlb.Request
	}{
		{"service prefix", "/ai.Gen/Chat", context.Background(), inferlb.Request{Service: inferlb.ServiceLLM}},
		{"exact method", "/ai.Emb/Embed", context.Background(), inferlb.Request{Service: inferlb.ServiceEmbedding}},
		{"exact beats nothing else in service", "/ai.Emb/Other", context.Background(), inferlb.Request{Service: inferlb.ServiceRerank}},
		{"default service", "/other.Svc/M", context.Background(), inferlb.Request{Service: inferlb.ServiceRerank}},
		{"metadata", "/ai.Gen/Chat", metadata.NewOutgoingContext(context.Background(), md),
			inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: keyer.Session("conv-7"), Session: true, Tenant: "acme", Model: "llama"}},
		{"appended metadata", "/ai.Gen/Chat", metadata.AppendToOutgoingContext(context.Background(), "x-session", "conv-8"),
			inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: keyer.Session("conv-8"), Session: true}},
		{"context request wins", "/ai.Gen/Chat", inferlb.NewContext(metadata.NewOutgoingContext(context.Background(), md), fromCtx), *fromCtx},
		{"context request gets the method's service", "/ai.Gen/Chat", inferlb.NewContext(context.Background(), noSvc),
			inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "ctx2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, res := h.pick(balancer.PickInfo{FullMethodName: tt.method, Ctx: tt.ctx})
			res.Done(sent)
			if got := rec.get(); got != tt.want {
				t.Errorf("core saw %+v, want %+v", got, tt.want)
			}
		})
	}
	if noSvc.Service != inferlb.ServiceUnknown {
		t.Error("the picker modified the caller's context Request")
	}
}

func TestDoneOutcomes(t *testing.T) {
	clock := testutil.NewClock()
	b := core.New(core.Options{Clock: clock, BreakerFailures: -1, OutlierInterval: -1})
	h := newHarness(t, registerShared(b), `{}`, 1)
	a := addr(0)
	do := func(di balancer.DoneInfo) {
		_, res := h.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z"})
		res.Done(di)
	}
	do(sent)
	do(balancer.DoneInfo{Err: status.Error(codes.Unavailable, "gone"), BytesSent: true})
	do(balancer.DoneInfo{Err: status.Error(codes.Canceled, "bye")})
	do(balancer.DoneInfo{}) // transport gone before the call was sent
	do(balancer.DoneInfo{Err: status.Error(codes.NotFound, "no such model"), BytesSent: true, BytesReceived: true})
	s := stats(t, b, a)
	// The NOT_FOUND that names no model is a client error: neither.
	if s.Successes != 1 || s.Failures != 1 || s.Overloads != 0 || s.ClientErrors != 1 {
		t.Fatalf("successes %d failures %d overloads %d client errors %d, want 1, 1, 0, 1", s.Successes, s.Failures, s.Overloads, s.ClientErrors)
	}
	start := clock.Now()
	do(balancer.DoneInfo{
		Err:       status.Error(codes.ResourceExhausted, "busy"),
		Trailer:   metadata.Pairs("grpc-retry-pushback-ms", "5000"),
		BytesSent: true, BytesReceived: true,
	})
	s = stats(t, b, a)
	if s.Overloads != 1 {
		t.Fatalf("overloads %d after RESOURCE_EXHAUSTED, want 1", s.Overloads)
	}
	if until := s.ExcludedUntil.Sub(start); until != 5*time.Second {
		t.Errorf("cooled down for %v, want the 5s pushback", until)
	}
}

// A refusal of the call as longer than the endpoint's context window is
// neither success nor failure, whatever code the server gave it (a
// Triton backend that does not map its errors sends INTERNAL), once an
// answer came back; other texts under those codes are what they were.
func TestOutcomeContextWindow(t *testing.T) {
	for _, tc := range []struct {
		name   string
		di     balancer.DoneInfo
		window int
	}{
		{"vLLM", balancer.DoneInfo{Err: status.Error(codes.InvalidArgument, "This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens."), BytesSent: true, BytesReceived: true}, 4096},
		{"SGLang", balancer.DoneInfo{Err: status.Error(codes.InvalidArgument, "The input (5000 tokens) is longer than the model's context length (4096 tokens)."), BytesSent: true, BytesReceived: true}, 4096},
		{"TensorRT-LLM as INTERNAL", balancer.DoneInfo{Err: status.Error(codes.Internal, "Encountered an error in forward: Prompt length (5056) exceeds maximum sequence length (2048)."), BytesSent: true, BytesReceived: true}, 2048},
		{"as UNKNOWN", balancer.DoneInfo{Err: status.Error(codes.Unknown, "The input (5000 tokens) is longer than the model's context length (4096 tokens)."), BytesSent: true, BytesReceived: true}, 4096},
		{"nothing came back", balancer.DoneInfo{Err: status.Error(codes.InvalidArgument, "The input (5000 tokens) is longer than the model's context length (4096 tokens)."), BytesSent: true}, 0},
		{"as UNAVAILABLE", balancer.DoneInfo{Err: status.Error(codes.Unavailable, "The input (5000 tokens) is longer than the model's context length (4096 tokens)."), BytesSent: true, BytesReceived: true}, 0},
		{"another INTERNAL", balancer.DoneInfo{Err: status.Error(codes.Internal, "CUDA out of memory"), BytesSent: true, BytesReceived: true}, 0},
		{"window cut at the text bound", balancer.DoneInfo{Err: status.Error(codes.InvalidArgument, strings.Repeat(" ", maxRefusalText-len("This model's maximum context length is 40"))+"This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens."), BytesSent: true, BytesReceived: true}, 0},
		{"past the text bound", balancer.DoneInfo{Err: status.Error(codes.InvalidArgument, strings.Repeat(" ", maxRefusalText)+"The input (5000 tokens) is longer than the model's context length (4096 tokens)."), BytesSent: true, BytesReceived: true}, 0},
	} {
		o := outcome(tc.di)
		assert.Equal(t, tc.window, o.ContextWindow, tc.name)
		if tc.window > 0 {
			assert.NoError(t, o.Err, tc.name)
		}
	}
	assert.True(t, outcome(balancer.DoneInfo{Err: status.Error(codes.Internal, "CUDA out of memory"), BytesSent: true, BytesReceived: true}).Err != nil, "other INTERNALs stay failures")

	// A limit on the prompt alone is said so (Outcome.PromptWindow): the
	// Balancer weighs prompts against it, not prompts and outputs.
	input := outcome(balancer.DoneInfo{Err: status.Error(codes.Internal, "Prompt length (200) exceeds maximum input length (128)"), BytesSent: true, BytesReceived: true})
	assert.Equal(t, [2]any{128, true}, [2]any{input.ContextWindow, input.PromptWindow}, "TensorRT-LLM's input length")
	total := outcome(balancer.DoneInfo{Err: status.Error(codes.Internal, "Prompt length (5056) exceeds maximum sequence length (2048)."), BytesSent: true, BytesReceived: true})
	assert.Equal(t, [2]any{2048, false}, [2]any{total.ContextWindow, total.PromptWindow}, "TensorRT-LLM's sequence length")
}

func TestOutcome(t *testing.T) {
	tests := []struct {
		name       string
		di         balancer.DoneInfo
		err        bool
		canceled   bool
		overloaded bool
		retryAfter time.Duration
	}{
		{"ok", sent, false, false, false, 0},
		{"not sent", balancer.DoneInfo{}, true, true, false, 0},
		{"ended with no answer", balancer.DoneInfo{BytesSent: true}, true, false, true, 0},
		{"canceled", balancer.DoneInfo{Err: status.Error(codes.Canceled, "x"), BytesSent: true}, true, true, false, 0},
		{"context canceled", balancer.DoneInfo{Err: context.Canceled, BytesSent: true}, true, true, false, 0},
		{"unavailable", balancer.DoneInfo{Err: status.Error(codes.Unavailable, "x"), BytesSent: true}, true, false, false, 0},
		{"refused stream", balancer.DoneInfo{Err: status.Error(codes.Unavailable, "stream terminated by RST_STREAM with error code: REFUSED_STREAM"), BytesSent: true}, true, false, true, 0},
		{"dropped by GOAWAY", balancer.DoneInfo{Err: status.Error(codes.Unavailable, "the connection is draining"), BytesSent: true}, true, false, true, 0},
		{"refused after bytes came back", balancer.DoneInfo{Err: status.Error(codes.Unavailable, "stream terminated by RST_STREAM with error code: REFUSED_STREAM"), BytesSent: true, BytesReceived: true}, true, false, false, 0},
		{"HTTP 429 from a proxy", balancer.DoneInfo{Err: status.Error(codes.Unavailable, "unexpected HTTP status code received from server: 429 (Too Many Requests); transport: received unexpected content-type \"text/plain\""), BytesSent: true, BytesReceived: true}, true, false, true, 0},
		{"Triton's queue full", balancer.DoneInfo{Err: status.Error(codes.Unavailable, "Exceeds maximum queue size"), BytesSent: true, BytesReceived: true}, true, false, true, 0},
		{"Triton's queue full in an ensemble", balancer.DoneInfo{Err: status.Error(codes.Unavailable, "in ensemble 'ensemble', [request id: <id_unknown>] Exceeds maximum queue size"), BytesSent: true, BytesReceived: true}, true, false, true, 0},
		{"Triton's queue timeout", balancer.DoneInfo{Err: status.Error(codes.Unavailable, "Request timeout expired"), BytesSent: true, BytesReceived: true}, true, false, true, 0},
		// The call counts as nothing here; with its model known, the
		// report makes it a not-served answer (TestE2ETritonUnknownModelIsNotServed).
		{"Triton's unknown model", balancer.DoneInfo{Err: status.Error(codes.NotFound, "Request for unknown model: 'llm' is not found"), BytesSent: true, BytesReceived: true}, true, true, false, 0},
		{"Triton's unknown model, older", balancer.DoneInfo{Err: status.Error(codes.Unavailable, "Inference request for unknown model 'llm'"), BytesSent: true, BytesReceived: true}, true, true, false, 0},
		{"another NOT_FOUND is the request's", balancer.DoneInfo{Err: status.Error(codes.NotFound, "no such user"), BytesSent: true, BytesReceived: true}, false, false, false, 0},
		{"unavailable with a pushback", balancer.DoneInfo{Err: status.Error(codes.Unavailable, "x"),
			Trailer: metadata.Pairs("grpc-retry-pushback-ms", "1500"), BytesSent: true, BytesReceived: true}, true, false, true, 1500 * time.Millisecond},
		{"unavailable with a do-not-retry pushback", balancer.DoneInfo{Err: status.Error(codes.Unavailable, "x"),
			Trailer: metadata.Pairs("grpc-retry-pushback-ms", "-1"), BytesSent: true, BytesReceived: true}, true, false, true, 0},
		{"unavailable with retry-after", balancer.DoneInfo{Err: status.Error(codes.Unavailable, "x"),
			Trailer: metadata.Pairs("retry-after", "2"), BytesSent: true, BytesReceived: true}, true, false, true, 2 * time.Second},
		// A shed text with a pushback: the server said for how long.
		{"Triton's queue full with a pushback", balancer.DoneInfo{Err: status.Error(codes.Unavailable, "Exceeds maximum queue size"),
			Trailer: metadata.Pairs("grpc-retry-pushback-ms", "1500"), BytesSent: true, BytesReceived: true}, true, false, true, 1500 * time.Millisecond},
		{"unavailable with another trailer", balancer.DoneInfo{Err: status.Error(codes.Unavailable, "x"),
			Trailer: metadata.Pairs("x-other", "1"), BytesSent: true, BytesReceived: true}, true, false, false, 0},
		{"HTTP 503 from a proxy", balancer.DoneInfo{Err: status.Error(codes.Unavailable, "unexpected HTTP status code received from server: 503 (Service Unavailable)"), BytesSent: true, BytesReceived: true}, true, false, false, 0},
		{"failed before its stream existed", balancer.DoneInfo{Err: status.Error(codes.Unavailable, "x")}, true, true, false, 0},
		{"refused by the client", balancer.DoneInfo{Err: status.Error(codes.Unauthenticated, "no token")}, true, true, false, 0},
		{"internal", balancer.DoneInfo{Err: status.Error(codes.Internal, "x"), BytesSent: true}, true, false, false, 0},
		{"request the client could not marshal", balancer.DoneInfo{Err: status.Error(codes.Internal, "grpc: error while marshaling: string field contains invalid UTF-8"), BytesSent: true}, true, true, false, 0},
		{"request the client could not compress", balancer.DoneInfo{Err: status.Error(codes.Internal, "grpc: error while compressing: x"), BytesSent: true}, true, true, false, 0},
		{"answer the client could not unmarshal", balancer.DoneInfo{Err: status.Error(codes.Internal, "grpc: failed to unmarshal the received message: proto: cannot parse invalid wire-format data"), BytesSent: true, BytesReceived: true}, true, true, false, 0},
		{"answer the client could not decompress", balancer.DoneInfo{Err: status.Error(codes.Internal, "grpc: failed to decompress the received message: x"), BytesSent: true, BytesReceived: true}, true, false, false, 0},
		{"answer the server could not compress", balancer.DoneInfo{Err: status.Error(codes.Internal, "grpc: error while compressing: x"), BytesSent: true, BytesReceived: true}, true, false, false, 0},
		{"deadline", balancer.DoneInfo{Err: status.Error(codes.DeadlineExceeded, "x"), BytesSent: true}, true, false, false, 0},
		{"plain error", balancer.DoneInfo{Err: errors.New("boom"), BytesSent: true}, true, false, false, 0},
		{"invalid argument is the caller's", balancer.DoneInfo{Err: status.Error(codes.InvalidArgument, "x"), BytesSent: true}, false, false, false, 0},
		{"exhausted", balancer.DoneInfo{Err: status.Error(codes.ResourceExhausted, "x"), BytesSent: true}, true, false, true, 0},
		{"answer over the receive limit", balancer.DoneInfo{Err: status.Error(codes.ResourceExhausted, "grpc: received message larger than max (1024 vs. 64)"),
			BytesSent: true, BytesReceived: true}, false, false, false, 0},
		{"request over the send limit", balancer.DoneInfo{Err: status.Error(codes.ResourceExhausted, "trying to send message larger than max (1024 vs. 64)"),
			BytesSent: true}, true, true, false, 0},
		{"exhausted pushback", balancer.DoneInfo{Err: status.Error(codes.ResourceExhausted, "x"),
			Trailer: metadata.Pairs("grpc-retry-pushback-ms", "1500"), BytesSent: true}, true, false, true, 1500 * time.Millisecond},
		{"exhausted retry-after", balancer.DoneInfo{Err: status.Error(codes.ResourceExhausted, "x"),
			Trailer: metadata.Pairs("retry-after", "2"), BytesSent: true}, true, false, true, 2 * time.Second},
		// Hints past what a Duration holds saturate (the core caps every
		// cooldown at MaxCooldown); they must not wrap to a short or
		// negative one, which would read as no hint.
		{"exhausted pushback past int64 ns", balancer.DoneInfo{Err: status.Error(codes.ResourceExhausted, "x"),
			Trailer: metadata.Pairs("grpc-retry-pushback-ms", "9300000000000"), BytesSent: true}, true, false, true, math.MaxInt64},
		{"exhausted pushback wrapping to under 1ms", balancer.DoneInfo{Err: status.Error(codes.ResourceExhausted, "x"),
			Trailer: metadata.Pairs("grpc-retry-pushback-ms", "18446744073710"), BytesSent: true}, true, false, true, math.MaxInt64},
		{"exhausted retry-after of a month", balancer.DoneInfo{Err: status.Error(codes.ResourceExhausted, "x"),
			Trailer: metadata.Pairs("retry-after", "2592000"), BytesSent: true}, true, false, true, 2592000 * time.Second},
		{"exhausted pushback past int64 ms", balancer.DoneInfo{Err: status.Error(codes.ResourceExhausted, "x"),
			Trailer: metadata.Pairs("grpc-retry-pushback-ms", "99999999999999999999"), BytesSent: true}, true, false, true, math.MaxInt64},
		{"exhausted retry-after past float64", balancer.DoneInfo{Err: status.Error(codes.ResourceExhausted, "x"),
			Trailer: metadata.Pairs("retry-after", "1e400"), BytesSent: true}, true, false, true, math.MaxInt64},
		{"exhausted retry-after past int64 ns", balancer.DoneInfo{Err: status.Error(codes.ResourceExhausted, "x"),
			Trailer: metadata.Pairs("retry-after", "1e300"), BytesSent: true}, true, false, true, math.MaxInt64},
		// Garbage after a number past int64 is unreadable, not a long
		// pushback: ParseInt reports the overflow before the garbage.
		{"exhausted pushback past int64 ms with garbage after", balancer.DoneInfo{Err: status.Error(codes.ResourceExhausted, "x"),
			Trailer: metadata.Pairs("grpc-retry-pushback-ms", "18700000000000000000A", "retry-after", "2"), BytesSent: true}, true, false, true, 2 * time.Second},
		{"exhausted bad hints", balancer.DoneInfo{Err: status.Error(codes.ResourceExhausted, "x"),
			Trailer: metadata.Pairs("grpc-retry-pushback-ms", "-1", "retry-after", "soon"), BytesSent: true}, true, false, true, 0},
		{"exhausted retry info", balancer.DoneInfo{Err: retryInfoStatus(codes.ResourceExhausted, durationpb.New(3*time.Second)),
			BytesSent: true, BytesReceived: true}, true, false, true, 3 * time.Second},
		{"exhausted retry info past int64 ns", balancer.DoneInfo{Err: retryInfoStatus(codes.ResourceExhausted, &durationpb.Duration{Seconds: 315576000000}),
			BytesSent: true, BytesReceived: true}, true, false, true, math.MaxInt64},
		{"exhausted invalid retry info", balancer.DoneInfo{Err: retryInfoStatus(codes.ResourceExhausted, &durationpb.Duration{Seconds: 1, Nanos: -1}),
			BytesSent: true, BytesReceived: true}, true, false, true, 0},
		// The trailer's pushback comes first.
		{"exhausted pushback and retry info", balancer.DoneInfo{Err: retryInfoStatus(codes.ResourceExhausted, durationpb.New(3*time.Second)),
			Trailer: metadata.Pairs("grpc-retry-pushback-ms", "1500"), BytesSent: true, BytesReceived: true}, true, false, true, 1500 * time.Millisecond},
		{"unavailable with retry info", balancer.DoneInfo{Err: retryInfoStatus(codes.Unavailable, durationpb.New(3*time.Second)),
			BytesSent: true, BytesReceived: true}, true, false, true, 3 * time.Second},
		{"unavailable with another detail", balancer.DoneInfo{Err: detailStatus(codes.Unavailable, &errdetails.ErrorInfo{Reason: "x"}),
			BytesSent: true, BytesReceived: true}, true, false, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := outcome(tt.di)
			if (o.Err != nil) != tt.err || o.Canceled() != tt.canceled || o.Overloaded != tt.overloaded || o.RetryAfter != tt.retryAfter {
				t.Errorf("outcome = %+v (canceled %v), want err %v canceled %v overloaded %v retryAfter %v",
					o, o.Canceled(), tt.err, tt.canceled, tt.overloaded, tt.retryAfter)
			}
			if o.Latency != 0 {
				t.Error("Latency must be left to the core")
			}
		})
	}
}

// retryInfoStatus is a status error of code carrying a google.rpc.RetryInfo
// with delay d.
func retryInfoStatus(code codes.Code, d *durationpb.Duration) error {
	return detailStatus(code, &errdetails.RetryInfo{RetryDelay: d})
}

func detailStatus(code codes.Code, detail protoadapt.MessageV1) error {
	st, err := status.New(code, "x").WithDetails(detail)
	if err != nil {
		panic(err)
	}
	return st.Err()
}

func TestSampleFromORCA(t *testing.T) {
	now := time.Now()
	r := &v3orcapb.OrcaLoadReport{
		CpuUtilization:         0.5,
		ApplicationUtilization: 0.9,
		NamedMetrics:           map[string]float64{"kv_cache_usage_perc": 0.8, "num_requests_waiting": 3, "num_requests_running": 0},
		Utilization:            map[string]float64{"prefix_cache_hit_rate": 0.25, "kv_cache_usage": 0.1},
	}
	s, bad := sampleFromORCA(r, now)
	if bad {
		t.Error("a good report read as bad")
	}
	want := map[telemetry.Field]float64{
		telemetry.CPUUtil: 0.5, telemetry.AppUtil: 0.9, telemetry.KVCacheUsage: 0.8,
		telemetry.Waiting: 3, telemetry.Running: 0, telemetry.PrefixCacheHitRate: 0.25,
	}
	for f, v := range want {
		if got, ok := s.Get(f); !ok || got != v {
			t.Errorf("%v = %v (present %v), want %v", f, got, ok, v)
		}
	}
	if !s.Time.Equal(now) {
		t.Errorf("Time = %v, want %v", s.Time, now)
	}

	// A server reporting two names of one field: the larger counts, as
	// in the HTTP load header, whichever name comes first.
	two, bad := sampleFromORCA(&v3orcapb.OrcaLoadReport{NamedMetrics: map[string]float64{
		"kv_cache_usage_perc": 0.9, "gpu_cache_usage_perc": 0.2, "num_requests_waiting": 7, "queue_depth": 2}}, now)
	if kv, _ := two.Get(telemetry.KVCacheUsage); kv != 0.9 || bad {
		t.Errorf("KV cache of 0.9 and 0.2 read as %v (bad %v), want 0.9", kv, bad)
	}
	if w, _ := two.Get(telemetry.Waiting); w != 7 {
		t.Errorf("7 and 2 waiting read as %v, want 7", w)
	}

	empty, _ := sampleFromORCA(&v3orcapb.OrcaLoadReport{NamedMetrics: map[string]float64{"kv_cache_usage": 1.7, "num_requests_waiting": -1, "other": 3}}, now)
	if !empty.Empty() {
		t.Errorf("zero utilizations, out-of-range and unknown metrics gave %+v, want nothing", empty)
	}
}

func TestPerCallORCAReachesTelemetry(t *testing.T) {
	h := newHarness(t, Name, `{}`, 2)
	b := h.lb().core.Load()
	a, res := h.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z"})
	di := sent
	di.ServerLoad = &v3orcapb.OrcaLoadReport{NamedMetrics: map[string]float64{"kv_cache_usage": 0.97}}
	res.Done(di)
	s, ok := b.Telemetry().Latest(a, time.Now(), time.Minute)
	if v, has := s.Get(telemetry.KVCacheUsage); !ok || !has || v != 0.97 {
		t.Fatalf("telemetry for %s = %+v, want kv_cache_usage 0.97", a, s)
	}

	off := newHarness(t, Name, `{"orca": {"perCall": false}}`, 1)
	_, res = off.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z"})
	res.Done(di)
	if _, ok := off.lb().core.Load().Telemetry().Latest(addr(0), time.Now(), time.Minute); ok {
		t.Fatal("per-call reports were published with orca.perCall off")
	}
}

// ORCA reports are stamped on the Balancer's clock, as every other sample
// the scorers compare with it: on a clock that is not the wall clock (a
// simulation, a test, a host whose wall clock is off), a report stamped
// with time.Now would read as hours old, or from the future.
func TestORCAReportsUseTheBalancersClock(t *testing.T) {
	clock := testutil.NewClock()
	clock.Set(time.Now().Add(24 * time.Hour))
	b := core.New(core.Options{Clock: clock})
	h := newHarness(t, registerShared(b), `{}`, 1)
	a, res := h.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z"})
	di := sent
	di.ServerLoad = &v3orcapb.OrcaLoadReport{NamedMetrics: map[string]float64{"kv_cache_usage": 0.97}}
	res.Done(di)
	s, ok := b.Telemetry().Latest(a, clock.Now(), time.Minute)
	if v, has := s.Get(telemetry.KVCacheUsage); !ok || !has || v != 0.97 {
		t.Fatalf("telemetry for %s on the Balancer's clock = %+v (fresh %v), want kv_cache_usage 0.97", a, s, ok)
	}
}

func TestSharedBalancer(t *testing.T) {
	b := core.New(core.Options{})
	name := registerShared(b)
	h := newHarness(t, name, `{}`, 3)
	for range 30 {
		_, res := h.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z"})
		res.Done(sent)
	}
	// An HTTP transport on the same Balancer, with a membership of its own
	// naming the same replicas, shares their state.
	httpSide, err := b.NewMembership()
	require.NoError(t, err)
	require.NoError(t, httpSide.Update([]inferlb.Endpoint{{Addr: addr(0)}, {Addr: addr(1)}, {Addr: addr(2)}}))
	p, err := httpSide.Pick(&inferlb.Request{})
	require.NoError(t, err, "HTTP-side pick on the shared Balancer")
	p.Done(inferlb.Outcome{})
	var picks uint64
	for _, s := range b.Stats() {
		picks += s.Picks
	}
	assert.Equal(t, uint64(31), picks, "picks of both memberships on the 3 shared endpoints")

	// WithEndpoint IDs let both transports name a replica the same way.
	eps := endpoints(2)
	eps[0] = WithEndpoint(eps[0], inferlb.Endpoint{ID: "replica-a", Weight: 2, Labels: map[string]string{"version": "v2"}})
	h.updateEndpoints(eps)
	for h.cc.ConnectAll() > 0 {
	}
	s := stats(t, b, "replica-a")
	if !s.Ready || s.Weight != 2 {
		t.Fatalf("replica-a: %+v, want ready with weight 2", s)
	}
	// The channel's update left the HTTP side's endpoints alone.
	seen := map[string]bool{}
	for range 60 {
		p, err := httpSide.Pick(&inferlb.Request{})
		require.NoError(t, err)
		seen[p.ID()] = true
		p.Done(inferlb.Outcome{})
	}
	assert.Equal(t, map[string]bool{addr(0): true, addr(1): true, addr(2): true}, seen)
	// Closing the channel takes out what only it listed.
	h.bal.Close()
	_, ok := b.Serial("replica-a")
	assert.False(t, ok, "replica-a outlived the channel that listed it")
	_, ok = b.Serial(addr(1))
	assert.True(t, ok, "the HTTP side's endpoint left with the channel")
}

// TestKeyOwnedElsewhereGoesToItsNextEndpoints: while readiness is changing,
// the core may offer an endpoint the picker in use has no READY child for
// (the next picker is on its way). A key owned there must not be re-asked of
// the same owner until the picker gives up: it goes where its spills go.
func TestKeyOwnedElsewhereGoesToItsNextEndpoints(t *testing.T) {
	b := core.New(core.Options{AffinitySeed: 7, MinKeyReuse: -1, SlowStartWindow: -1})
	name := registerShared(b)
	h := newHarness(t, name, `{}`, 4)
	// A picker from before the fourth endpoint was READY.
	cur := h.picker().(*picker)
	byID := maps.Clone(cur.children.byID)
	delete(byID, addr(3))
	stale := &picker{mem: cur.mem, cfg: cur.cfg, children: newChildTable(b, byID)}
	owned := 0
	for k := range uint64(200) {
		key := k*0x9e3779b97f4a7c15 | 1
		req := &inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: key}
		p, err := cur.mem.Pick(req)
		require.NoError(t, err)
		p.Done(inferlb.Outcome{Err: context.Canceled})
		if p.ID() != addr(3) {
			continue
		}
		owned++
		ctx := inferlb.NewContext(context.Background(), req)
		seen := map[string]bool{}
		for range 6 {
			res, err := stale.Pick(balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: ctx})
			require.NoError(t, err)
			res.Done(sent)
			seen[res.SubConn.(*grpcfake.SubConn).Addr()] = true
		}
		// As a spill: P2C between the key's next two endpoints.
		assert.LessOrEqual(t, len(seen), 2, "key %x went to %v", key, seen)
		assert.NotContains(t, seen, addr(3))
	}
	assert.Greater(t, owned, 20, "about a quarter of the keys are owned by the endpoint the picker lacks")
}

func TestTunablesChangeReplacesCore(t *testing.T) {
	h := newHarness(t, Name, `{}`, 2)
	first := h.lb().core.Load()
	h.update(2)
	if h.lb().core.Load() != first {
		t.Fatal("an unchanged config replaced the core")
	}
	empty, err := (&Builder{name: Name}).ParseConfig([]byte(`{"balancer": {}}`))
	if err != nil {
		t.Fatal(err)
	}
	h.cfg = empty
	h.update(2)
	if h.lb().core.Load() != first {
		t.Fatal(`an empty "balancer" section, the same defaults, replaced the core and its live state`)
	}
	cfg, err := (&Builder{name: Name}).ParseConfig([]byte(`{"balancer": {"errorAlpha": 0.5, "ejectionTime": "1s", "affinity": "strict"}}`))
	if err != nil {
		t.Fatal(err)
	}
	h.cfg = cfg
	h.update(2)
	second := h.lb().core.Load()
	if second == first {
		t.Fatal("new tunables kept the old core")
	}
	// The same tunables written otherwise (a control plane that renders
	// durations in milliseconds, a mode in capitals) are no change: a
	// new core would start its live state over for nothing.
	same, err := (&Builder{name: Name}).ParseConfig([]byte(`{"balancer": {"errorAlpha": 0.5, "ejectionTime": "1000ms", "affinity": "Strict"}}`))
	if err != nil {
		t.Fatal(err)
	}
	h.cfg = same
	h.update(2)
	if h.lb().core.Load() != second {
		t.Fatal("the same tunables, written otherwise, replaced the core and its live state")
	}
	// The READY children carried over: the new core must know they are ready.
	for i := range 2 {
		if !stats(t, second, addr(i)).Ready {
			t.Errorf("endpoint %d not ready in the new core", i)
		}
	}
	_, res := h.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z"})
	res.Done(sent)
	// Nothing routes with the old core: closed, it gives back its
	// endpoints (and their telemetry slots) instead of living on with
	// its membership, a copy of every endpoint's state per config push.
	if _, err := first.Pick(&inferlb.Request{}); !errors.Is(err, core.ErrClosed) {
		t.Errorf("the replaced core still picks: %v", err)
	}
}

func TestPickAllocs(t *testing.T) {
	if testutil.Race {
		t.Skip("the race detector drops pooled values at random")
	}
	h := newHarness(t, Name, `{"methods": {"/ai.Gen/": "llm"}, "affinityKeyHeader": "x-session"}`, 8)
	p := h.picker()
	plain := balancer.PickInfo{FullMethodName: "/ai.Gen/Chat", Ctx: context.Background()}
	withKey := balancer.PickInfo{FullMethodName: "/ai.Gen/Chat",
		Ctx: metadata.AppendToOutgoingContext(context.Background(), "x-session", "conv-1")}
	withReq := balancer.PickInfo{FullMethodName: "/ai.Gen/Chat",
		Ctx: inferlb.NewContext(context.Background(), &inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: 7})}
	UnaryRetry(2) // as a channel with the interceptor: picks look for its state
	// As a process with the stream interceptors too: a unary call's pick
	// and Done then look for their state as well, and allocate no more.
	StreamTiming(nil)
	StreamEstimate(nil)
	st := &retryState{method: "/ai.Gen/Chat"}
	withRetry := balancer.PickInfo{FullMethodName: "/ai.Gen/Chat",
		Ctx: context.WithValue(context.Background(), retryKey{}, st)}
	for _, tt := range []struct {
		name string
		info balancer.PickInfo
		max  float64
		st   *retryState // the interceptor's, which settles a held attempt when the call returns
	}{{"method only", plain, 0, nil}, {"context request", withReq, 0, nil}, {"affinity header", withKey, 1, nil}, {"UnaryRetry call", withRetry, 0, st}} {
		got := testing.AllocsPerRun(1000, func() {
			res, err := p.Pick(tt.info)
			if err != nil {
				t.Fatal(err)
			}
			res.Done(sent)
			tt.st.settle(nil) // the call returned without error
		})
		if got > tt.max {
			t.Errorf("%s: %v allocs per Pick+Done, want at most %v", tt.name, got, tt.max)
		}
	}
}

func TestModelHeaderSelectsSubset(t *testing.T) {
	eps := endpoints(4)
	for i := range eps {
		model := "llama-8b"
		if i >= 2 {
			model = "llama-70b"
		}
		eps[i] = WithEndpoint(eps[i], inferlb.Endpoint{Labels: map[string]string{"model": model}})
	}
	h := newHarnessWith(t, Name, `{"modelHeader": "x-model"}`, eps)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-model", "llama-70b")
	for range 100 {
		a, res := h.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: ctx})
		if a != addr(2) && a != addr(3) {
			t.Fatalf("a llama-70b call went to %s, which serves llama-8b", a)
		}
		res.Done(sent)
	}

	// A model nobody serves: the error names it, for the UNAVAILABLE
	// message of a call that does not wait for ready.
	ctx = metadata.AppendToOutgoingContext(context.Background(), "x-model", "mistral-7b")
	_, err := h.picker().Pick(balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: ctx})
	require.ErrorIs(t, err, core.ErrNoEndpoints)
	require.ErrorIs(t, err, core.ErrModelNotListed)
	assert.Contains(t, err.Error(), `no endpoint lists the requested model: "mistral-7b"`)
	_, isStatus := status.FromError(err)
	assert.False(t, isStatus, "a status error would end wait-for-ready calls instead of holding them")

	// The name is request data: the error quotes a bounded prefix of it.
	huge := strings.Repeat("\x80", 32<<10) // each byte quotes as four
	ctx = metadata.AppendToOutgoingContext(context.Background(), "x-model", huge)
	_, err = h.picker().Pick(balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: ctx})
	require.ErrorIs(t, err, core.ErrNoEndpoints)
	assert.Less(t, len(err.Error()), 2048)
	assert.Contains(t, err.Error(), "(32768 bytes)")
}

// namedPicker is a child picker that only says who it is.
type namedPicker string

func (namedPicker) Pick(balancer.PickInfo) (balancer.PickResult, error) {
	return balancer.PickResult{}, nil
}

func TestChildTableFindsChildrenBySerialAndByID(t *testing.T) {
	b := core.New(core.Options{})
	eps := func(ids ...string) []inferlb.Endpoint {
		out := make([]inferlb.Endpoint, len(ids))
		for i, id := range ids {
			out[i] = inferlb.Endpoint{ID: id, Addr: id}
		}
		return out
	}
	require.NoError(t, b.Update(eps("a", "b", "c")))
	children := map[string]balancer.Picker{"a": namedPicker("a"), "c": namedPicker("c")}
	tab := newChildTable(b, children)
	require.Len(t, tab.bySerial, 3, "serials 1..3 are dense: indexed, not hashed")

	// Every pick finds its own child, or none when the endpoint has no
	// READY child here.
	seen := map[string]int{}
	for range 300 {
		p, err := b.Pick(&inferlb.Request{})
		require.NoError(t, err)
		c, ok := tab.get(&p)
		if p.ID() == "b" {
			assert.False(t, ok)
		} else {
			require.True(t, ok)
			assert.Equal(t, namedPicker(p.ID()), c)
		}
		seen[p.ID()]++
		p.Done(inferlb.Outcome{})
	}
	assert.Len(t, seen, 3)

	// "a" leaves and comes back: a new serial, past the table, found by ID
	// in the old table; serials are never reused.
	require.NoError(t, b.Update(eps("b", "c")))
	require.NoError(t, b.Update(eps("a", "b", "c")))
	sa, ok := b.Serial("a")
	require.True(t, ok)
	assert.EqualValues(t, 4, sa)
	for range 100 {
		p, err := b.Pick(&inferlb.Request{})
		require.NoError(t, err)
		if p.ID() == "a" {
			c, ok := tab.get(&p)
			require.True(t, ok)
			assert.Equal(t, namedPicker("a"), c)
		}
		p.Done(inferlb.Outcome{})
	}

	// Churn makes serials sparse: the table falls back to IDs alone
	// rather than growing with the churn.
	for i := range 100 {
		require.NoError(t, b.Update(eps("a", fmt.Sprintf("tmp-%d", i))))
	}
	require.NoError(t, b.Update(eps("a", "z")))
	sparse := newChildTable(b, map[string]balancer.Picker{"a": namedPicker("a"), "z": namedPicker("z")})
	assert.Nil(t, sparse.bySerial)
	_, ok = b.Serial("gone")
	assert.False(t, ok)
}

// The tenant named in the configured metadata header is confined to its
// shard when balancer.tenantShardSize is set.
func TestTenantMetadataShardsEndpoints(t *testing.T) {
	h := newHarness(t, Name, `{"tenantHeader": "x-tenant", "balancer": {"affinitySeed": 9, "tenantShardSize": 2}}`, 8)
	used := map[string]bool{}
	for i := range 10 {
		ctx := metadata.AppendToOutgoingContext(context.Background(), "x-tenant", fmt.Sprintf("tenant-%d", i))
		got := map[string]int{}
		for range 100 {
			a, res := h.pick(balancer.PickInfo{FullMethodName: "/ai.Gen/Chat", Ctx: ctx})
			res.Done(sent)
			got[a]++
			used[a] = true
		}
		assert.Len(t, got, 2, "tenant-%d reached %v", i, got)
	}
	assert.Greater(t, len(used), 4, "tenants' shards spread over the fleet")
	// Calls without a tenant use every endpoint.
	all := map[string]bool{}
	for range 400 {
		a, res := h.pick(balancer.PickInfo{FullMethodName: "/ai.Gen/Chat"})
		res.Done(sent)
		all[a] = true
	}
	assert.Len(t, all, 8)
}

// A channel that finds no free membership on its shared core fails its
// calls with that reason instead of routing over someone else's endpoints.
func TestSharedCoreWithoutAFreeMembership(t *testing.T) {
	bal, cc := channelWithoutAMembership(t)
	assert.Equal(t, connectivity.TransientFailure, cc.State().ConnectivityState)
	_, err := cc.State().Picker.Pick(balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: context.Background()})
	assert.ErrorIs(t, err, core.ErrTooManyMemberships)
	// A status error, so gRPC fails wait-for-ready calls too instead of
	// holding them for a picker that never comes.
	st, ok := status.FromError(err)
	require.True(t, ok, "not a status error: %v", err)
	assert.Equal(t, codes.Unavailable, st.Code())
	assert.Contains(t, st.Message(), "too many open Memberships")

	// A resolver error (DNS failing too) does not hide the reason, nor
	// turn the status error into one wait-for-ready calls wait out.
	bal.ResolverError(errors.New("no such host"))
	assert.Equal(t, connectivity.TransientFailure, cc.State().ConnectivityState)
	_, err = cc.State().Picker.Pick(balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: context.Background()})
	assert.ErrorIs(t, err, core.ErrTooManyMemberships)
	st, ok = status.FromError(err)
	require.True(t, ok, "not a status error after a resolver error: %v", err)
	assert.Equal(t, codes.Unavailable, st.Code())
}

// ClientConn.Connect on a channel that is not idle calls the policy's
// ExitIdle: on one without a membership it must not replace the picker
// that fails every call with the reason by endpointsharding's, which says
// "no children to pick from" and which wait-for-ready calls wait out.
func TestSharedCoreWithoutAFreeMembershipExitIdle(t *testing.T) {
	bal, cc := channelWithoutAMembership(t)
	bal.ExitIdle()
	assert.Equal(t, connectivity.TransientFailure, cc.State().ConnectivityState)
	_, err := cc.State().Picker.Pick(balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: context.Background()})
	assert.ErrorIs(t, err, core.ErrTooManyMemberships)
	st, ok := status.FromError(err)
	require.True(t, ok, "not a status error after ExitIdle: %v", err)
	assert.Equal(t, codes.Unavailable, st.Code())
}

// channelWithoutAMembership builds a channel on a shared core whose
// memberships are all taken, and gives it two endpoints, which fails.
func channelWithoutAMembership(t *testing.T) (balancer.Balancer, *grpcfake.ClientConn) {
	t.Helper()
	b := core.New(core.Options{})
	for {
		if _, err := b.NewMembership(); err != nil {
			break
		}
	}
	name := registerShared(b)
	cc := grpcfake.NewClientConn()
	bal := balancer.Get(name).Build(cc, balancer.BuildOptions{})
	t.Cleanup(bal.Close)
	err := bal.UpdateClientConnState(balancer.ClientConnState{ResolverState: resolver.State{Endpoints: endpoints(2)}})
	require.ErrorIs(t, err, core.ErrTooManyMemberships)
	return bal, cc
}

// With "idByHost" endpoints without a WithEndpoint ID are named by host, so
// an HTTP transport on the same Balancer that names the replicas by host
// shares their state.
func TestIDByHost(t *testing.T) {
	b := core.New(core.Options{})
	h := newHarness(t, registerShared(b), `{"idByHost": true}`, 3)
	var ids []string
	for _, s := range b.Stats() {
		ids = append(ids, s.ID)
		assert.True(t, s.Ready, s.ID)
	}
	assert.Equal(t, []string{"10.0.0.0", "10.0.0.1", "10.0.0.2"}, ids)
	for range 30 {
		a, res := h.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z"})
		assert.True(t, strings.HasPrefix(a, "10.0.0."), a)
		res.Done(sent)
	}
	var picks uint64
	for _, s := range b.Stats() {
		picks += s.Picks
	}
	assert.EqualValues(t, 30, picks)
	// A WithEndpoint ID still wins.
	eps := endpoints(2)
	eps[1] = WithEndpoint(eps[1], inferlb.Endpoint{ID: "replica-b"})
	h.updateEndpoints(eps)
	for h.cc.ConnectAll() > 0 {
	}
	ids = ids[:0]
	for _, s := range b.Stats() {
		ids = append(ids, s.ID)
	}
	assert.Equal(t, []string{"10.0.0.0", "replica-b"}, ids)
}

// The resolver may rename an endpoint and keep its address (WithEndpoint
// gives it an ID); pickfirst then keeps the SubConn, and its out-of-band
// ORCA reports must reach the endpoint under its new ID.
func TestOOBReportFollowsARenamedEndpoint(t *testing.T) {
	h := newHarness(t, Name, `{}`, 1) // the fake has no ORCA producer: the test delivers the report
	lb := h.lb()
	subs := []*subConn{h.onlySubConn(t)}

	h.updateEndpoints([]resolver.Endpoint{WithEndpoint(endpoints(1)[0], inferlb.Endpoint{ID: "replica-0"})})
	lb.mu.Lock()
	_, kept := lb.subConns[subs[0]]
	lb.mu.Unlock()
	require.True(t, kept, "the SubConn outlives the rename")

	subs[0].OnLoadReport(&v3orcapb.OrcaLoadReport{ApplicationUtilization: 0.9})
	s, ok := lb.core.Load().Telemetry().Latest("replica-0", time.Now(), time.Minute)
	require.True(t, ok, "no report under the endpoint's new ID")
	u, _ := s.Get(telemetry.AppUtil)
	assert.Equal(t, 0.9, u)
	_, ok = lb.core.Load().Telemetry().Latest(addr(0), time.Now(), time.Minute)
	assert.False(t, ok, "nothing under the old ID")
}

// TestReorderedAddressesKeepTheEndpoint: a resolver may list an endpoint's
// addresses in another order from one update to the next (DNS answers do
// not come sorted; a dual-stack endpoint may put either family first). It
// is the same endpoint: endpointsharding keeps its child, and the core
// must keep its live state (in-flight calls, picks, errors, breaker).
func TestReorderedAddressesKeepTheEndpoint(t *testing.T) {
	eps := func(reversed bool) []resolver.Endpoint {
		out := make([]resolver.Endpoint, 2)
		for i := range out {
			as := []resolver.Address{{Addr: fmt.Sprintf("10.0.0.%d:50051", i)}, {Addr: fmt.Sprintf("[fd00::%d]:50051", i)}}
			if reversed {
				as[0], as[1] = as[1], as[0]
			}
			out[i] = resolver.Endpoint{Addresses: as}
		}
		return out
	}
	for _, byHost := range []bool{false, true} {
		t.Run(fmt.Sprintf("idByHost=%v", byHost), func(t *testing.T) {
			h := newHarnessWith(t, Name, fmt.Sprintf(`{"idByHost": %v}`, byHost), eps(false))
			b := h.lb().core.Load()
			var held []balancer.PickResult
			for range 10 {
				_, res := h.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z"})
				held = append(held, res)
			}
			_, res := h.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z"})
			res.Done(balancer.DoneInfo{BytesSent: true, Err: status.Error(codes.Internal, "boom")})
			before := b.Stats()

			for _, reversed := range []bool{true, false, true} {
				h.updateEndpoints(eps(reversed))
				for h.cc.ConnectAll() > 0 {
				}
				after := b.Stats()
				if len(after) != len(before) {
					t.Fatalf("reversed=%v: endpoints %+v, want the same as before %+v", reversed, after, before)
				}
				for _, s := range before {
					a := stats(t, b, s.ID)
					if a.Picks != s.Picks || a.InFlight != s.InFlight || a.Failures != s.Failures || !a.Ready {
						t.Errorf("reversed=%v: %s: picks %d -> %d, in flight %d -> %d, failures %d -> %d, ready %v",
							reversed, s.ID, s.Picks, a.Picks, s.InFlight, a.InFlight, s.Failures, a.Failures, a.Ready)
					}
				}
			}
			for _, res := range held {
				res.Done(sent)
			}
		})
	}
}

// A pick on the picker of a policy that has been closed (gRPC's graceful
// switch to another policy publishes the new policy's picker, then closes
// the old one; a pick that took the old picker can still be running) makes
// the call wait for the next picker, which is already there, as a
// pickfirst picker's shut-down SubConn would. Before, the closed
// membership refused the pick with ErrNoEndpoints, and gRPC failed a call
// that does not wait for ready with UNAVAILABLE.
func TestPickAfterCloseWaitsForTheNextPicker(t *testing.T) {
	for _, name := range []string{Name, registerShared(coreForTest())} {
		h := newHarness(t, name, `{}`, 2)
		p := h.picker()
		h.bal.Close()
		_, err := p.Pick(balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: context.Background()})
		assert.Equal(t, balancer.ErrNoSubConnAvailable, err, "%s: a pick after Close", name)
	}
}

// A connection the server closes gracefully (its MaxConnectionAge, which
// servers set so clients spread over new replicas) takes a pickfirst child
// from READY to IDLE, and endpointsharding has it reconnect at once. The
// server is the same warm process: the endpoint must not go through slow
// start again, or with MaxConnectionAge under SlowStartWindow it would
// never leave it (before, it ramped from SlowStartMinWeight after each
// rotation: a real server with a 300ms MaxConnectionAge stayed at 0.1). A
// reconnect after TRANSIENT_FAILURE (connection refused, or a health check
// NOT_SERVING) is a recovery, and ramps, as in Envoy.
func TestReconnectAfterAGracefulCloseDoesNotRamp(t *testing.T) {
	h := newHarness(t, Name, `{}`, 2)
	b := h.lb().core.Load()
	for range 20 { // both endpoints serve: they are in use
		_, res := h.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z"})
		res.Done(sent)
	}
	require.NotZero(t, stats(t, b, addr(0)).Picks)

	sc := h.subConn(addr(0))
	sc.SetState(balancer.SubConnState{ConnectivityState: connectivity.Idle})
	require.False(t, stats(t, b, addr(0)).Ready, "not ready while it reconnects")
	for h.cc.ConnectAll() > 0 {
	}
	s := stats(t, b, addr(0))
	require.True(t, s.Ready)
	assert.Equal(t, 1.0, s.RampFactor, "ramping again after its connection was rotated")

	// An outage: the reconnect fails first.
	sc = h.subConn(addr(0))
	sc.SetState(balancer.SubConnState{ConnectivityState: connectivity.Idle})
	sc.SetState(balancer.SubConnState{ConnectivityState: connectivity.Connecting})
	sc.SetState(balancer.SubConnState{ConnectivityState: connectivity.TransientFailure, ConnectionError: errors.New("connection refused")})
	for h.cc.ConnectAll() > 0 {
	}
	s = stats(t, b, addr(0))
	require.True(t, s.Ready)
	assert.Less(t, s.RampFactor, 1.0, "no slow start after an outage")

	// A rotation while it ramps leaves the ramp as it was.
	sc = h.subConn(addr(0))
	sc.SetState(balancer.SubConnState{ConnectivityState: connectivity.Idle})
	for h.cc.ConnectAll() > 0 {
	}
	assert.Less(t, stats(t, b, addr(0)).RampFactor, 1.0, "a rotation ended the ramp of a recovering endpoint")
}

// TestMetadataSessionSticks: a key from the configured affinity metadata
// is a session the caller named, followed whatever the estimate of how
// often prompt keys recur: after a stream of unique prompt keys on the
// same Balancer, such a session's calls were spread over the fleet.
func TestMetadataSessionSticks(t *testing.T) {
	b := core.New(core.Options{Rand: testutil.NewRand(8)})
	h := newHarness(t, registerShared(b), `{"methods": {"/ai.Gen/": "llm"}, "affinityKeyHeader": "x-session-id"}`, 4)
	rng := rand.New(rand.NewPCG(5, 6))
	for range 16_000 { // a RAG pipeline's unique documents, keyed by their prompts
		ctx := inferlb.NewContext(context.Background(), &inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: rng.Uint64() | 1})
		_, res := h.pick(balancer.PickInfo{FullMethodName: "/ai.Gen/Chat", Ctx: ctx})
		res.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
	}
	require.False(t, b.KeyReuse().FollowingKeys)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-session-id", "agent-session-7")
	got := map[string]int{}
	for range 12 {
		a, res := h.pick(balancer.PickInfo{FullMethodName: "/ai.Gen/Chat", Ctx: ctx})
		res.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
		got[a]++
	}
	assert.Len(t, got, 1, "every turn on one server: %v", got)
}

// TestOutcomeClientErrors: the codes that map to 4xx are client errors
// (neither success nor failure, no latency); Triton's NOT_FOUND for a model
// it lacks and a refusal as too long keep their own meanings, and the codes
// of the endpoint's failures and overloads theirs.
func TestOutcomeClientErrors(t *testing.T) {
	answered := func(c codes.Code, msg string) balancer.DoneInfo {
		return balancer.DoneInfo{Err: status.Error(c, msg), BytesSent: true, BytesReceived: true}
	}
	for _, c := range []codes.Code{codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange, codes.Unauthenticated,
		codes.PermissionDenied, codes.NotFound, codes.AlreadyExists, codes.Aborted} {
		o := outcome(answered(c, "x"))
		assert.True(t, o.ClientError, "%v", c)
		assert.NoError(t, o.Err, "%v", c)
	}
	for _, c := range []codes.Code{codes.OK, codes.Canceled, codes.Unknown, codes.DeadlineExceeded, codes.ResourceExhausted,
		codes.Unimplemented, codes.Internal, codes.Unavailable, codes.DataLoss} {
		assert.False(t, outcome(answered(c, "x")).ClientError, "%v", c)
	}
	assert.False(t, outcome(answered(codes.NotFound, "Request for unknown model: 'llm' is not found")).ClientError, "Triton's unknown model")
	tooLong := answered(codes.InvalidArgument, "This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens.")
	o := outcome(tooLong)
	assert.Equal(t, 4096, o.ContextWindow)
	assert.False(t, o.ClientError, "a refusal as too long")
	assert.True(t, outcomeOf(tooLong, false).ClientError, "a refusal as too long not believed is what its code makes it")
}

// Of the overload answers, a stream a GOAWAY dropped and an attempt that
// ended with nothing back are no refusal (inferlb.Outcome.Drained): the
// connection closed, which says nothing of the endpoint's load, and they
// must not put it on probation. A refused stream, and every answer that
// says the server is busy, is one.
func TestOutcomeDrained(t *testing.T) {
	for _, tc := range []struct {
		name    string
		di      balancer.DoneInfo
		drained bool
	}{
		{"dropped by GOAWAY", balancer.DoneInfo{Err: status.Error(codes.Unavailable, "the connection is draining"), BytesSent: true}, true},
		{"ended with no answer", balancer.DoneInfo{BytesSent: true}, true},
		{"refused stream", balancer.DoneInfo{Err: status.Error(codes.Unavailable, "stream terminated by RST_STREAM with error code: REFUSED_STREAM"), BytesSent: true}, false},
		{"exhausted", balancer.DoneInfo{Err: status.Error(codes.ResourceExhausted, "x"), BytesSent: true}, false},
		{"HTTP 429 from a proxy", balancer.DoneInfo{Err: status.Error(codes.Unavailable, "unexpected HTTP status code received from server: 429 (Too Many Requests)"), BytesSent: true, BytesReceived: true}, false},
		{"Triton's queue full", balancer.DoneInfo{Err: status.Error(codes.Unavailable, "Exceeds maximum queue size"), BytesSent: true, BytesReceived: true}, false},
	} {
		o := outcome(tc.di)
		assert.True(t, o.Overloaded, tc.name)
		assert.Equal(t, tc.drained, o.Drained, tc.name)
	}
}
