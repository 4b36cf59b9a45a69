package grpcbalancer

import (
	"io"
	"sync/atomic"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// heldReport holds the report of an attempt that grpc-go ended without
// error until the error the application gets is known: grpc-go also ends
// an attempt so when the server failed the call before the client had
// written its request (see outcome). The unary interceptors
// (retryState.hold) and StreamTiming (streamState.hold) decide what to
// hold and when to settle; the attempt's DoneInfo waits in its call
// (call.heldDI).
//
// Concurrency: hold and settle may race (gRPC's goroutine, the
// application's, a context's AfterFunc): exactly one settle reports a
// held attempt.
type heldReport struct {
	c atomic.Pointer[call]
}

// hold keeps c's report of di. It reports false when another attempt is
// held already (hedging): that one is reported now, as before.
func (h *heldReport) hold(c *call, di balancer.DoneInfo) bool {
	if h.c.Load() != nil {
		return false
	}
	c.heldDI = di // c is this attempt's alone until h takes it
	return h.c.CompareAndSwap(nil, c)
}

// settle reports the held attempt, if any, with err, the error the
// application got: nil, io.EOF (a stream that ended well) or an OK status
// leave the report as grpc-go gave it; any other error is the attempt's.
func (h *heldReport) settle(err error) {
	if h.c.Load() == nil {
		return
	}
	c := h.c.Swap(nil)
	if c == nil {
		return
	}
	if c.heldStop != nil {
		c.heldStop() // false once it has run: then it settles nothing more
	}
	di := c.heldDI
	if err != nil && err != io.EOF && status.Code(err) != codes.OK {
		di.Err = err
	}
	c.report(di)
}
