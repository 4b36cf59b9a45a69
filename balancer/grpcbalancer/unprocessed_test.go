package grpcbalancer_test

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// refuser is a bare HTTP/2 server that processes no stream: it answers
// each one as a server at its stream limit does (RST_STREAM REFUSED_STREAM)
// or, with goAway, as one closing its connection gracefully does (a GOAWAY
// whose last processed stream is none). It is stopped when the test ends.
type refuser struct {
	addr    string
	streams atomic.Int64 // streams it was asked to open
}

func startRefuser(t testing.TB, goAway bool) *refuser {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &refuser{addr: lis.Addr().String()}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				r.serve(c, goAway)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = lis.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return r
}

func (r *refuser) serve(c net.Conn, goAway bool) {
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil || string(preface) != http2.ClientPreface {
		return
	}
	fr := http2.NewFramer(c, c)
	if fr.WriteSettings() != nil {
		return
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				err = fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				err = fr.WritePing(true, f.Data)
			}
		case *http2.HeadersFrame:
			r.streams.Add(1)
			if goAway {
				err = fr.WriteGoAway(0, http2.ErrCodeNo, nil)
			} else {
				err = fr.WriteRSTStream(f.StreamID, http2.ErrCodeRefusedStream)
			}
		}
		if err != nil {
			return
		}
	}
}

// A server that does not process a stream tells the client so (HTTP/2
// guarantees the request had no effect) and gRPC retries the call
// transparently, but its Done reports UNAVAILABLE like a crash. Refusing
// a stream (a server at its limit, shedding load) or dropping it with a
// graceful GOAWAY (MaxConnectionAge; a draining sidecar greets every new
// connection so) is not a failure: it must cool the endpoint down, so the
// retry goes elsewhere, without adding to its failures (its breaker would
// trip on every drain). Every call succeeds, on a real backend. This also
// pins the messages grpc-go gives both cases, which outcome recognises.
func TestE2EUnprocessedStreams(t *testing.T) {
	for _, tc := range []struct {
		name   string
		goAway bool
	}{{"refused stream", false}, {"graceful goaway", true}} {
		t.Run(tc.name, func(t *testing.T) {
			bs := fleet(t, 2, nil)
			ref := startRefuser(t, tc.goAway)
			clock := testutil.NewClock()
			name, b := shared(t, core.Options{Clock: clock, PanicThreshold: -1, OutlierInterval: -1})
			conn, _ := dial(t, append(bs, &backend{addr: ref.addr}), name, `{}`)
			client := testgrpc.NewTestServiceClient(conn)
			ctx := testContext(t)
			const want = 2 * core.DefaultBreakerFailures
			for n := 0; ref.streams.Load() < want; n++ {
				if n == 3000 {
					t.Fatalf("the refusing server saw %d of 3000 calls", ref.streams.Load())
				}
				clock.Advance(2 * core.DefaultCooldown) // past any cooldown
				if _, err := client.EmptyCall(ctx, &testgrpc.Empty{}, grpc.WaitForReady(true)); err != nil {
					t.Fatalf("call %d: %v (gRPC retries an unprocessed stream transparently)", n, err)
				}
			}
			s := endpointStats(t, b, ref.addr)
			if s.Failures != 0 || s.BreakerOpen || s.Trips != 0 || s.ErrorRate != 0 {
				t.Errorf("unprocessed streams counted as failures: %+v", s)
			}
			if s.Successes != 0 {
				t.Errorf("unprocessed streams counted as successes: %d", s.Successes)
			}
			if got, want := int64(s.Overloads), ref.streams.Load(); got != want {
				t.Errorf("overloads = %d, want %d (one per unprocessed stream)", got, want)
			}
			if s.ExcludedUntil.IsZero() {
				// The last call's first attempt was refused, and the clock
				// has not moved since.
				t.Error("a refused stream did not cool the endpoint down")
			}
		})
	}
}
