package grpcbalancer

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
)

// BenchmarkUnaryEstimate measures what UnaryEstimate adds to a unary
// call's pick: the call goes through the interceptor (or none) to an
// invoker that picks on the policy's picker (8 READY endpoints on a fake
// ClientConn) with the context it gets, and reports Done. The request is
// a SimpleRequest with a prompt of size bytes.
//
//   - none: no interceptor, and none installed in the process (the pick
//     skips the estimate's context lookup);
//   - none-installed: no interceptor on this call, while one is installed
//     elsewhere in the process (the pick looks for an estimate, finds
//     none);
//   - estimate: UnaryEstimate(nil), SizeEstimate.
func BenchmarkUnaryEstimate(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10} {
		req := &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: make([]byte, size)}}
		for _, mode := range []string{"none", "none-installed", "estimate"} {
			b.Run(fmt.Sprintf("size=%d/interceptor=%s", size, mode), func(b *testing.B) {
				h := newHarness(b, Name, `{"methods": {"/ai.Gen/": "llm"}}`, 8)
				p := h.picker()
				done := balancer.DoneInfo{BytesSent: true, BytesReceived: true}
				invoker := func(ctx context.Context, method string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
					res, err := p.Pick(balancer.PickInfo{FullMethodName: method, Ctx: ctx})
					if err != nil {
						return err
					}
					res.Done(done)
					return nil
				}
				ic := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
					return invoker(ctx, method, req, reply, cc, opts...)
				}
				was := estimateInUse.Load()
				switch mode {
				case "none":
					estimateInUse.Store(false)
				case "none-installed":
					estimateInUse.Store(true)
				case "estimate":
					ic = UnaryEstimate(nil)
				}
				b.Cleanup(func() { estimateInUse.Store(was) })
				ctx := context.Background()
				b.ReportAllocs()
				for b.Loop() {
					if err := ic(ctx, benchMethod, req, nil, nil, invoker); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
