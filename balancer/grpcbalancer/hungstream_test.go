package grpcbalancer_test

import (
	"context"
	"io"
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

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/grpcbalancer"
	"github.com/inferlb/inferlb/balancer/internal/testhook"
	"github.com/inferlb/inferlb/internal/testutil"
)

// hungEngine is a generation server whose engine may hang behind its live
// API server: answering, a stream sends one message and ends; hung, it
// sends its headers at once (as a server does before any token) and
// nothing more until its caller leaves. sendFirst makes a hung stream
// send one message before it hangs.
type hungEngine struct {
	testgrpc.UnimplementedTestServiceServer
	hung, sendFirst atomic.Bool
}

func (s *hungEngine) StreamingOutputCall(_ *testgrpc.StreamingOutputCallRequest, ss grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	if !s.hung.Load() {
		return ss.Send(&testgrpc.StreamingOutputCallResponse{})
	}
	if err := ss.SendHeader(metadata.Pairs("x-engine", "hung")); err != nil {
		return err
	}
	if s.sendFirst.Load() {
		if err := ss.Send(&testgrpc.StreamingOutputCallResponse{}); err != nil {
			return err
		}
	}
	<-ss.Context().Done()
	return ss.Context().Err()
}

// enteredRecv signals on entered (without blocking) each time the
// application enters a stream's RecvMsg, inside StreamTiming: the test
// cancels the call once its reader is waiting, without a sleep.
func enteredRecv(entered chan struct{}) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return &signalStream{ClientStream: cs, entered: entered}, nil
	}
}

type signalStream struct {
	grpc.ClientStream
	entered chan struct{}
}

func (s *signalStream) RecvMsg(m any) error {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	return s.ClientStream.RecvMsg(m)
}

// A generation stream whose server sent its headers and no message, and
// whose caller gave up on it while waiting in RecvMsg for its first
// message, had nothing of its answer: through StreamTiming it is
// Unanswered, and two such give-ups after waiting 30 s on a replica whose
// answers took a second make the run that prices a hung replica up
// (scoring.State.Abandoned). grpc-go counts the headers as bytes
// received, and a server sends them at once, before any token, also when
// its engine hangs: before, both counted as answered (Unanswered 0,
// Abandoned 0), as they still do without StreamTiming, which alone sees
// the messages. A caller that gives up after the first message, or while
// it is away from the stream (not in RecvMsg: a message may be waiting
// unread), is no wait with nothing back.
func TestE2EHungStreamCancelledBeforeAMessageIsUnanswered(t *testing.T) {
	for _, tc := range []struct {
		name          string
		timing        bool // StreamTiming installed
		sendFirst     bool // the hung stream sends one message first
		away          bool // the caller cancels while not in RecvMsg
		want, wantRun uint64
	}{
		{name: "headers, no message, caller waiting", timing: true, want: 2, wantRun: 2},
		{name: "without StreamTiming", timing: false},
		{name: "after the first message", timing: true, sendFirst: true},
		{name: "caller away from the stream", timing: true, away: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			engine := &hungEngine{}
			engine.sendFirst.Store(tc.sendFirst)
			addr := serve(t, func(srv *grpc.Server) { testgrpc.RegisterTestServiceServer(srv, engine) })
			clock := testutil.NewClock()
			name, b := shared(t, core.Options{Clock: clock, Rand: testutil.NewRand(1)})
			entered := make(chan struct{}, 1)
			ics := []grpc.StreamClientInterceptor{enteredRecv(entered)}
			if tc.timing {
				ics = append([]grpc.StreamClientInterceptor{grpcbalancer.StreamTiming(nil)}, ics...)
			}
			conn, _ := dial(t, []*backend{{addr: addr}}, name, `{"methods": {"/grpc.testing.TestService/": "llm"}}`,
				grpc.WithChainStreamInterceptor(ics...))
			client := testgrpc.NewTestServiceClient(conn)
			idle := func() {
				t.Helper()
				ctx, cancel := context.WithTimeout(testContext(t), 5*time.Second)
				defer cancel()
				require.NoError(t, testhook.Await(ctx, b, func() bool { return endpointStats(t, b, addr).InFlight == 0 }))
			}

			// An answer that takes a second: the replica's generation
			// latency.
			st, err := client.StreamingOutputCall(testContext(t), &testgrpc.StreamingOutputCallRequest{}, grpc.WaitForReady(true))
			require.NoError(t, err)
			clock.Advance(time.Second)
			require.NoError(t, st.RecvMsg(new(testgrpc.StreamingOutputCallResponse)))
			require.Equal(t, io.EOF, st.RecvMsg(new(testgrpc.StreamingOutputCallResponse)))
			idle()

			engine.hung.Store(true)
			for range 2 {
				ctx, cancel := context.WithCancel(testContext(t))
				st, err := client.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{}, grpc.WaitForReady(true))
				require.NoError(t, err)
				_, err = st.Header() // the headers came: bytes received
				require.NoError(t, err)
				if tc.sendFirst {
					require.NoError(t, st.RecvMsg(new(testgrpc.StreamingOutputCallResponse)))
				}
				select {
				case <-entered: // a RecvMsg's signal, read by now
				default:
				}
				if tc.away {
					clock.Advance(30 * time.Second)
					cancel()
					assert.Equal(t, codes.Canceled, status.Code(st.RecvMsg(new(testgrpc.StreamingOutputCallResponse))))
				} else {
					ended := make(chan error, 1)
					go func() { ended <- st.RecvMsg(new(testgrpc.StreamingOutputCallResponse)) }()
					<-entered // the reader waits in RecvMsg
					clock.Advance(30 * time.Second)
					cancel()
					assert.Equal(t, codes.Canceled, status.Code(<-ended))
				}
				idle()
			}
			s := endpointStats(t, b, addr)
			t.Logf("canceled %d, unanswered %d, abandoned run %d", s.Canceled, s.Unanswered, s.Abandoned)
			assert.EqualValues(t, 2, s.Canceled)
			assert.Equal(t, tc.want, s.Unanswered, "cancels reported unanswered")
			assert.EqualValues(t, tc.wantRun, s.Abandoned, "run of abandoned generation calls")
		})
	}
}
