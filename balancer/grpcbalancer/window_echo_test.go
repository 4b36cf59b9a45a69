package grpcbalancer_test

import (
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/grpcbalancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// UnaryCall answers a call with a payload INVALID_ARGUMENT, as Triton
// answers an input it does not know: with echo, its text copies the
// payload, as Triton's copies the input's name ("unexpected inference
// input '<name>' for model '<model>'"); without, it does not.
func (b *backend) UnaryCall(_ context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	b.calls.Add(1)
	if body := req.GetPayload().GetBody(); len(body) > 0 {
		if b.echo {
			return nil, status.Errorf(codes.InvalidArgument, "unexpected inference input '%s' for model 'llm'", body)
		}
		return nil, status.Error(codes.InvalidArgument, "unexpected inference input for model 'llm'")
	}
	return &testgrpc.SimpleResponse{}, nil
}

// A caller cannot make the policy remember a window of its choosing by
// sending a refusal's text in a field that servers copy into their
// errors, through either interceptor: before, a refusal copied by a and
// b was remembered as their 10-token window, and the calls of the model
// after went to c alone.
func TestE2EARefusalCopiedFromTheRequestIsNotBelieved(t *testing.T) {
	const text = "Prompt length (50) exceeds maximum sequence length (10)."
	for _, tc := range []struct {
		name        string
		interceptor grpc.UnaryClientInterceptor
	}{
		{"UnaryRetry", grpcbalancer.UnaryRetry(3)},
		{"UnaryOutcome", grpcbalancer.UnaryOutcome()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b, c := &backend{echo: true}, &backend{echo: true}, &backend{}
			bs := []*backend{a, b, c}
			for _, be := range bs {
				be.start(t)
			}
			name, bal := shared(t, core.Options{Rand: testutil.NewRand(1), BreakerFailures: 2})
			conn, _ := dial(t, bs, name, `{}`, grpc.WithChainUnaryInterceptor(tc.interceptor))
			allReady(t, conn, bal, len(bs))
			client := testgrpc.NewTestServiceClient(conn)
			call := func(body string) error {
				ctx := inferlb.NewContext(testContext(t), &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llm", PromptTokens: 100})
				_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte(body)}})
				return err
			}
			echoSpreads(t, bal, bs, text, func(body string) error {
				err := call(body)
				if body != "" {
					require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
					return nil
				}
				return err
			})
		})
	}
}

// The same through StreamTiming: the message a stream sent is what its
// refusal is checked against.
func TestE2EARefusalCopiedIntoAStreamsStatusIsNotBelieved(t *testing.T) {
	const text = "This model's maximum context length is 10 tokens."
	a, b, c := &backend{echo: true}, &backend{echo: true}, &backend{}
	bs := []*backend{a, b, c}
	for _, be := range bs {
		be.start(t)
	}
	name, bal := shared(t, core.Options{Rand: testutil.NewRand(1), BreakerFailures: 2})
	conn, _ := dial(t, bs, name, `{}`, grpc.WithChainStreamInterceptor(grpcbalancer.StreamTiming(nil)))
	allReady(t, conn, bal, len(bs))
	client := testgrpc.NewTestServiceClient(conn)
	stream := func(body string) error {
		ctx := inferlb.NewContext(testContext(t), &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llm", PromptTokens: 100})
		req := &testgrpc.StreamingOutputCallRequest{ResponseParameters: []*testgrpc.ResponseParameters{{Size: 1}}}
		if body != "" {
			req.Payload = &testgrpc.Payload{Body: []byte(body)}
		}
		s, err := client.StreamingOutputCall(ctx, req)
		if err != nil {
			return err
		}
		for {
			if _, err := s.Recv(); err != nil {
				if err == io.EOF {
					return nil
				}
				return err
			}
		}
	}
	echoSpreads(t, bal, bs, text, func(body string) error {
		err := stream(body)
		if body != "" && status.Code(err) == codes.InvalidArgument {
			return nil // c streams it
		}
		return err
	})
}

// echoSpreads sends calls carrying a refusal's text (send with text,
// which returns nil for the answer expected) until both of bs's first two
// backends, which copy it into their errors, have answered one, then
// checks that no window was remembered and that 30 plain calls (send
// with "") still reach both.
func echoSpreads(t *testing.T, bal *core.Balancer, bs []*backend, text string, send func(body string) error) {
	t.Helper()
	a, b, c := bs[0], bs[1], bs[2]
	for i := 0; i < 30 && (a.calls.Load() == 0 || b.calls.Load() == 0); i++ {
		require.NoError(t, send(text))
	}
	require.Positive(t, a.calls.Load())
	require.Positive(t, b.calls.Load())
	for _, be := range bs {
		s := stats(t, bal, be.addr)
		assert.Zero(t, s.TooLong, "no window remembered")
		assert.Zero(t, s.Failures)
	}
	a0, b0, c0 := a.calls.Load(), b.calls.Load(), c.calls.Load()
	for i := range 30 {
		require.NoError(t, send(""), "call %d", i)
	}
	da, db, dc := a.calls.Load()-a0, b.calls.Load()-b0, c.calls.Load()-c0
	t.Logf("30 calls after: a %d, b %d, c %d", da, db, dc)
	assert.Positive(t, da)
	assert.Positive(t, db)
}
