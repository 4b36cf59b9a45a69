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
// hold and when to settle, and the unary interceptors also park an
// attempt whose report reads the call's reply (retryState.park); the
// attempt's DoneInfo waits in its call (call.heldDI).
//
// Once closed (the unary interceptors close it when their call returns),
// it holds nothing more: an attempt that ends after the call returned (an
// interceptor inside ours ran the invoker in a goroutine and gave up on
// it) is reported at once, as grpc-go ended it. Held, nothing would
// settle it, and it would stay in flight on its endpoint for good.
//
// Concurrency: hold, settle and close may race (gRPC's goroutine, the
// application's, a context's AfterFunc): exactly one settle reports a
// held attempt, and an attempt held as h closes is reported by one of
// them.
type heldReport struct {
	c      atomic.Pointer[call]
	closed atomic.Bool
}

// hold keeps c's report of di. It reports false when another attempt is
// held already (hedging), or h is closed: that one is reported now, as
// before.
func (h *heldReport) hold(c *call, di balancer.DoneInfo) bool {
	if h.closed.Load() || h.c.Load() != nil {
		return false
	}
	c.heldDI = di // c is this attempt's alone until h takes it
	if !h.c.CompareAndSwap(nil, c) {
		return false
	}
	// Closed meanwhile: the closing settle may have looked before c was
	// held. Whoever takes c back reports it.
	if h.closed.Load() && h.c.CompareAndSwap(c, nil) {
		return false
	}
	return true
}

// close settles the held attempt, if any, with err (see settle), and
// holds nothing more.
func (h *heldReport) close(err error) {
	h.closed.Store(true)
	h.settle(err)
}

// settle reports the held attempt, if any, with err, the error the
// application got: nil, io.EOF (a stream that ended well) or an OK status
// leave the report as grpc-go gave it, and so does an error that is no
// gRPC status (see adopts; streamState.settle makes such an error
// errStreamHidden first); a gRPC status is the attempt's, and so are this
// package's own errRetriedAttempt, errStreamLeft and errStreamHidden.
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
	if adopts(err) {
		di.Err = err
	}
	c.report(di)
}

// adopts reports whether err, the error the application got from a call
// or stream whose attempt grpc-go ended without error, is the attempt's:
// a gRPC status other than OK, or a report this package makes. An error
// that is no gRPC status comes from an interceptor or stream wrapper
// inside ours (a reply that failed the application's validation), not
// from the endpoint, which answered: as the call's error it was UNKNOWN,
// a failure, and tripped healthy endpoints' breakers.
func adopts(err error) bool {
	if err == nil || err == io.EOF {
		return false
	}
	if err == errRetriedAttempt || err == errStreamLeft || err == errStreamHidden {
		return true
	}
	st, ok := status.FromError(err)
	return ok && st.Code() != codes.OK
}
