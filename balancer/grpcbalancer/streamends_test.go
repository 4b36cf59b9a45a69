package grpcbalancer_test

import (
	"context"
	"io"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/grpcbalancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// endScript streams msgs messages, then ends with end (and trailer).
type endScript struct {
	testgrpc.UnimplementedTestServiceServer
	msgs    int
	block   bool // after its messages, wait for the client to leave
	end     error
	trailer metadata.MD
}

func (s *endScript) StreamingOutputCall(_ *testgrpc.StreamingOutputCallRequest, ss grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	for range s.msgs {
		if err := ss.Send(&testgrpc.StreamingOutputCallResponse{}); err != nil {
			return err
		}
	}
	if s.block {
		<-ss.Context().Done()
		return ss.Context().Err()
	}
	if s.trailer != nil {
		ss.SetTrailer(s.trailer)
	}
	return s.end
}

func (s *endScript) FullDuplexCall(ss grpc.BidiStreamingServer[testgrpc.StreamingOutputCallRequest, testgrpc.StreamingOutputCallResponse]) error {
	for {
		if _, err := ss.Recv(); err == io.EOF {
			break
		} else if err != nil {
			return err
		}
	}
	for range s.msgs {
		if err := ss.Send(&testgrpc.StreamingOutputCallResponse{}); err != nil {
			return err
		}
	}
	if s.trailer != nil {
		ss.SetTrailer(s.trailer)
	}
	return s.end
}

func retryInfoStatus(t *testing.T, d time.Duration) error {
	st, err := status.New(codes.ResourceExhausted, "busy").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}

// TestE2EStreamEndsAreReportedOnce: every way a stream ends reaches the
// core once, as what it was, through StreamEstimate and StreamTiming in
// either order: a RESOURCE_EXHAUSTED with a pushback (the trailer's, or a
// google.rpc.RetryInfo's) is an overload that cools the endpoint down for
// it, before the first token or after some, on server and bidirectional
// streams (CloseSend, then the error); read by Header alone (a
// trailers-only answer) too; a stream the caller leaves undrained and
// cancels is neither; one that ends well a success.
func TestE2EStreamEndsAreReportedOnce(t *testing.T) {
	busy := status.Error(codes.ResourceExhausted, "busy")
	pb := metadata.Pairs("grpc-retry-pushback-ms", "7000")
	for _, tc := range []struct {
		name          string
		srv           *endScript
		bidi, header  bool
		abandonAfter  int // >0: receive this many, then cancel without draining
		wantOverloads uint64
		wantCooldown  time.Duration
		wantCanceled  uint64
		wantSucc      uint64
	}{
		{name: "pushback before a token", srv: &endScript{end: busy, trailer: pb}, wantOverloads: 1, wantCooldown: 7 * time.Second},
		{name: "pushback after tokens", srv: &endScript{msgs: 2, end: busy, trailer: pb}, wantOverloads: 1, wantCooldown: 7 * time.Second},
		{name: "retryinfo before a token", srv: &endScript{end: retryInfoStatus(t, 9*time.Second)}, wantOverloads: 1, wantCooldown: 9 * time.Second},
		{name: "retryinfo after tokens", srv: &endScript{msgs: 3, end: retryInfoStatus(t, 9*time.Second)}, wantOverloads: 1, wantCooldown: 9 * time.Second},
		{name: "header-only failure read by Header", srv: &endScript{end: busy, trailer: pb}, header: true, wantOverloads: 1, wantCooldown: 7 * time.Second},
		{name: "bidi closesend then error", srv: &endScript{end: busy, trailer: pb}, bidi: true, wantOverloads: 1, wantCooldown: 7 * time.Second},
		{name: "bidi retryinfo after tokens", srv: &endScript{msgs: 2, end: retryInfoStatus(t, 9*time.Second)}, bidi: true, wantOverloads: 1, wantCooldown: 9 * time.Second},
		{name: "abandoned undrained", srv: &endScript{msgs: 3, block: true}, abandonAfter: 1, wantCanceled: 1},
		{name: "eof", srv: &endScript{msgs: 3}, wantSucc: 1},
		{name: "bidi eof", srv: &endScript{msgs: 3}, bidi: true, wantSucc: 1},
	} {
		for _, order := range []string{"estimate first", "timing first"} {
			t.Run(tc.name+"/"+order, func(t *testing.T) {
				addr := serve(t, func(srv *grpc.Server) { testgrpc.RegisterTestServiceServer(srv, tc.srv) })
				clock := testutil.NewClock()
				name, b := shared(t, core.Options{Clock: clock, Rand: testutil.NewRand(1)})
				conn, _ := dial(t, []*backend{{addr: addr}}, name, `{"methods": {"/grpc.testing.TestService/": "llm"}}`,
					chain(order))
				client := testgrpc.NewTestServiceClient(conn)
				ctx, cancel := context.WithCancel(testContext(t))
				defer cancel()
				var cs grpc.ClientStream
				req := &testgrpc.StreamingOutputCallRequest{}
				if tc.bidi {
					st, err := client.FullDuplexCall(ctx, grpc.WaitForReady(true))
					if err != nil {
						t.Fatal(err)
					}
					if err := st.Send(req); err != nil {
						t.Fatal(err)
					}
					if err := st.CloseSend(); err != nil {
						t.Fatal(err)
					}
					cs = st
				} else {
					st, err := client.StreamingOutputCall(ctx, req, grpc.WaitForReady(true))
					if err != nil {
						t.Fatal(err)
					}
					cs = st
				}
				// The RecvMsg after a cancel returns once gRPC has ended the
				// attempt: Done has run.
				if tc.header {
					if _, err := cs.Header(); err != nil {
						t.Fatalf("Header: %v", err) // trailers-only: the error is RecvMsg's
					}
					cancel()
					_ = cs.RecvMsg(new(testgrpc.StreamingOutputCallResponse))
				} else {
					n := 0
					for {
						err := cs.RecvMsg(new(testgrpc.StreamingOutputCallResponse))
						if err != nil {
							if want := status.Code(tc.srv.end); err != io.EOF && status.Code(err) != want || err == io.EOF && want != codes.OK {
								t.Fatalf("stream ended %v, want %v", err, want)
							}
							break
						}
						n++
						if tc.abandonAfter > 0 && n == tc.abandonAfter {
							cancel()
							err := cs.RecvMsg(new(testgrpc.StreamingOutputCallResponse))
							for i := 0; err == nil && i < tc.srv.msgs; i++ { // messages already received
								err = cs.RecvMsg(new(testgrpc.StreamingOutputCallResponse))
							}
							if status.Code(err) != codes.Canceled {
								t.Fatalf("RecvMsg after the cancel: %v", err)
							}
							break
						}
					}
				}
				s := endpointStats(t, b, addr)
				if s.Picks != 1 || s.InFlight != 0 || s.Overloads != tc.wantOverloads || s.Canceled != tc.wantCanceled || s.Successes != tc.wantSucc || s.Failures != 0 {
					t.Errorf("picks %d, in flight %d, overloads %d, canceled %d, successes %d, failures %d; want 1, 0, %d, %d, %d, 0",
						s.Picks, s.InFlight, s.Overloads, s.Canceled, s.Successes, s.Failures, tc.wantOverloads, tc.wantCanceled, tc.wantSucc)
				}
				var cd time.Duration
				if !s.ExcludedUntil.IsZero() {
					cd = s.ExcludedUntil.Sub(clock.Now())
				}
				if cd != tc.wantCooldown {
					t.Errorf("cooldown %v, want %v", cd, tc.wantCooldown)
				}
			})
		}
	}
}

// chain installs StreamEstimate and StreamTiming in the order named.
func chain(order string) grpc.DialOption {
	e, ti := grpcbalancer.StreamEstimate(nil), grpcbalancer.StreamTiming(nil)
	if order == "timing first" {
		return grpc.WithChainStreamInterceptor(ti, e)
	}
	return grpc.WithChainStreamInterceptor(e, ti)
}
