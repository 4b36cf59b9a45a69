package grpcbalancer_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/grpcbalancer"
)

// scriptServer streams one message per entry of the request's response
// parameters, each message's payload the next line of its script, and ends
// the stream with OK: a decoupled model's stream, as Triton sends it
// (ModelStreamInfer), where a request's failure is a message carrying an
// error, not the stream's status.
type scriptServer struct {
	testgrpc.UnimplementedTestServiceServer
	script []string
}

func (s *scriptServer) StreamingOutputCall(req *testgrpc.StreamingOutputCallRequest, ss grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	for _, line := range s.script {
		if err := ss.Send(&testgrpc.StreamingOutputCallResponse{Payload: &testgrpc.Payload{Body: []byte(line)}}); err != nil {
			return err
		}
	}
	return nil
}

// inbandError is the test's reading of a message: "error: text" carries
// the error text (as Triton's ModelStreamInferResponse.error_message does),
// "status: code" a gRPC status the application builds from it.
func inbandError(msg any) error {
	body := string(msg.(*testgrpc.StreamingOutputCallResponse).GetPayload().GetBody())
	if text, ok := strings.CutPrefix(body, "error: "); ok {
		return errors.New(text)
	}
	if text, ok := strings.CutPrefix(body, "status: "); ok {
		return status.Error(codes.InvalidArgument, text)
	}
	return nil
}

// inbandTokens counts a message as a token unless it carries an error.
func inbandTokens(msg any) int {
	if inbandError(msg) != nil {
		return 0
	}
	return 1
}

// TestStreamInBandErrors: through StreamTimingWith's Error, a response
// message that carries an error makes the stream's outcome, whatever
// status ends the stream after it (OK, or CANCELLED when the application
// stops reading at the error): Triton's load-shedding texts an overload
// answer (a cooldown), other errors the endpoint's failure, and a status
// the application returns for it classified as a stream's status is (an
// InvalidArgument is the request's: a client error, neither). Without an error message
// the stream is a success, timed as before. A refusal of the call as
// longer than the endpoint's context window is neither, as a unary call's
// is, whether the message carries a status (which the policy once read as
// a success) or Triton's error_message text (once a failure).
func TestStreamInBandErrors(t *testing.T) {
	for _, tc := range []struct {
		name                          string
		script                        []string
		stopAtError                   bool // the application cancels the stream after the error
		successes, failures, overload uint64
		tooLong, clientErrors         uint64
	}{
		{"tokens only", []string{"a", "b", "c"}, false, 1, 0, 0, 0, 0},
		{"queue full first", []string{"error: Exceeds maximum queue size"}, false, 0, 0, 1, 0, 0},
		{"queue timeout", []string{"error: Request timeout expired"}, false, 0, 0, 1, 0, 0},
		{"failed after tokens", []string{"a", "b", "error: Encountered an error in forwardAsync: CUDA error"}, false, 0, 1, 0, 0, 0},
		{"failed, then cancelled", []string{"a", "error: executor failed", "c", "d"}, true, 0, 1, 0, 0, 0},
		{"the request's error", []string{"status: prompt too long"}, false, 0, 0, 0, 0, 1},
		{"too long, as a status", []string{"status: This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens."}, false, 0, 0, 0, 1, 0},
		{"too long, as Triton's text", []string{"error: Encountered an error in forward: Prompt length (5056) exceeds maximum sequence length (2048)."}, false, 0, 0, 0, 1, 0},
		// No model in the call: neither (with one, not served).
		{"unknown model", []string{"error: Request for unknown model: 'llm' is not found"}, false, 0, 0, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bk := &backend{addr: serve(t, func(srv *grpc.Server) {
				testgrpc.RegisterTestServiceServer(srv, &scriptServer{script: tc.script})
			})}
			name, b := shared(t, core.Options{})
			conn, _ := dial(t, []*backend{bk}, name, `{"methods": {"/grpc.testing.TestService/": "llm"}}`,
				grpc.WithChainStreamInterceptor(grpcbalancer.StreamTimingWith(grpcbalancer.StreamOptions{Tokens: inbandTokens, Error: inbandError})))
			client := testgrpc.NewTestServiceClient(conn)
			ctx, cancel := context.WithCancel(testContext(t))
			defer cancel()
			st, err := client.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{}, grpc.WaitForReady(true))
			if err != nil {
				t.Fatal(err)
			}
			for {
				m, err := st.Recv()
				if err == io.EOF {
					break
				}
				if err != nil {
					if tc.stopAtError && status.Code(err) == codes.Canceled {
						break
					}
					t.Fatal(err)
				}
				if tc.stopAtError && inbandError(m) != nil {
					cancel()
				}
			}
			s := endpointStats(t, b, bk.addr)
			if s.InFlight != 0 || s.Successes != tc.successes || s.Failures != tc.failures || s.Overloads != tc.overload || s.TooLong != tc.tooLong || s.ClientErrors != tc.clientErrors {
				t.Errorf("in flight %d, successes %d, failures %d, overloads %d, too long %d, client errors %d; want 0, %d, %d, %d, %d, %d",
					s.InFlight, s.Successes, s.Failures, s.Overloads, s.TooLong, s.ClientErrors, tc.successes, tc.failures, tc.overload, tc.tooLong, tc.clientErrors)
			}
		})
	}
}
