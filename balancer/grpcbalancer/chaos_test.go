package grpcbalancer_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/grpcbalancer"
	"github.com/inferlb/inferlb/balancer/internal/testhook"
)

// endpointStats returns the core's view of the endpoint at address a.
func endpointStats(t testing.TB, b *core.Balancer, a string) core.EndpointStats {
	t.Helper()
	for _, s := range b.Stats() {
		if s.ID == a {
			return s
		}
	}
	t.Fatalf("no endpoint %s", a)
	return core.EndpointStats{}
}

// TestE2EChaosKillAndRestart is the gRPC half of the resilience chaos test:
// four backends under steady load, one killed (its connections cut, calls
// in flight lost) and later restarted on the same address. Every
// wait-for-ready call must succeed: the ones the dead backend accepted but
// never answered are retried by UnaryRetry within the retry budget, and the
// ones that never left the client by gRPC's transparent retry. Traffic to
// the dead backend must stop within a few calls, and it must get traffic
// again once it is back.
func TestE2EChaosKillAndRestart(t *testing.T) {
	const workers = 8
	bs := fleet(t, 4, func(i int, b *backend) {
		b.delay = 2 * time.Millisecond
		if i == 0 {
			b.hold = &holdGate{arrived: make(chan struct{}, 1)}
		}
	})
	name, b := shared(t, core.Options{})
	conn, _ := dial(t, bs, name, `{}`,
		grpc.WithChainUnaryInterceptor(grpcbalancer.UnaryRetry(3)),
		// Reconnect quickly once the backend is back, so the test stays short.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: 100 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}))
	ctx := testContext(t)
	wfr := grpc.WaitForReady(true)
	dead := bs[0].addr

	// Steady load; backend 0 is killed a third of the way through, while
	// it holds calls it has accepted (the kill must lose something) and
	// none of its answers is under way: from the kill's start it holds
	// every call it starts, and the kill waits until each call in flight
	// to it is one it holds. A call whose answer had begun (its headers
	// came) is not UnaryRetry's to retry, by design. Before, the kill
	// stopped the server once a call had started there, counting on the
	// backend's 2 ms delay: now and then that call was answered first and
	// the kill lost nothing (1 run in 7 of the package's race binary,
	// -test.cpu 4, three binaries on 2 cores; every run with a 50 ms pause
	// before the kill), and now and then another call's answer was half
	// written and that call failed (2 runs in 31; its attempt had
	// received bytes).
	var atKill core.EndpointStats
	kill := func() {
		gate := bs[0].hold
		gate.on.Store(true)
		quiet := func() bool {
			n := gate.n.Load()
			return n > 0 && endpointStats(t, b, dead).InFlight == n
		}
		// Each call that leaves flight wakes Await; a call that arrives
		// and is held wakes it through arrived.
		for !quiet() && ctx.Err() == nil {
			wctx, cancel := context.WithCancel(ctx)
			go func() {
				select {
				case <-gate.arrived:
					cancel()
				case <-wctx.Done():
				}
			}()
			_ = testhook.Await(wctx, b, quiet)
			cancel()
		}
		atKill = endpointStats(t, b, dead)
		bs[0].srv.Stop()
		gate.on.Store(false) // the restarted backend answers
	}
	if err := loadWith(ctx, conn, workers, 900, 300, kill, wfr); err != nil {
		t.Fatalf("a wait-for-ready call was lost across the kill: %v", err)
	}
	after := endpointStats(t, b, dead)
	picks, failures := after.Picks-atKill.Picks, after.Failures-atKill.Failures
	retries := b.RetryStats()
	t.Logf("after the kill: %d picks and %d failures on the dead backend, retries %+v, ready %v, breaker open %v, detection %v",
		picks, failures, retries, after.Ready, after.BreakerOpen, after.LastDetection)
	// The calls in flight when it died fail; a few more may be drawn before
	// the channel reports the connection gone. Then nothing.
	if picks > 2*workers {
		t.Errorf("the dead backend was picked %d times after the kill, want at most %d", picks, 2*workers)
	}
	if after.Ready {
		t.Error("the dead backend is still ready in the core")
	}
	if failures == 0 || retries.Allowed == 0 {
		t.Errorf("the kill cost %d failures and %d retries; the test meant to lose an accepted call", failures, retries.Allowed)
	}

	// Restart it on the same address, its port held by start while it was
	// down; the channel reconnects with backoff and the backend gets calls
	// again, none of them failing meanwhile.
	served := bs[0].calls.Load()
	bs[0].start(t)
	deadline := time.Now().Add(10 * time.Second)
	for bs[0].calls.Load() == served {
		if time.Now().After(deadline) {
			t.Fatalf("the restarted backend got no call in 10s: %+v", endpointStats(t, b, dead))
		}
		if err := load(ctx, conn, workers, 100, wfr); err != nil {
			t.Fatalf("a call failed while the backend came back: %v", err)
		}
	}
	// Issue 7: a recovered endpoint ramps up over the slow-start window
	// (the core starts it when the subchannel turns READY again) instead of
	// taking its full share at once. The ramp's shape is tested with a fake
	// clock in package balancer; here the first calls after the restart
	// must favour its peers.
	if r := endpointStats(t, b, dead).RampFactor; r >= 0.5 {
		t.Errorf("ramp factor right after the restart = %.2f, want well below 1", r)
	}
	before := counts(bs)
	if err := load(ctx, conn, workers, 400, wfr); err != nil {
		t.Fatal(err)
	}
	c := counts(bs)
	got := []int64{c[0] - before[0], c[1] - before[1], c[2] - before[2], c[3] - before[3]}
	t.Logf("first 400 calls after the restart: %v", got)
	// Against half the peers' mean, not each peer: the peers' shares
	// follow their real latencies on a busy machine, and one peer that met
	// a stall drew fewer calls than the ramping backend (1 run in 260
	// under -race: [30 20 165 185]). With the ramp the backend takes 10-25%
	// of a peer's mean share ([11 127 128 134] .. [30 ...]); without it
	// (SlowStartWindow: -1) about all of it ([92 106 104 98], [106 93 101
	// 100]), which each peer's share alone did not always tell.
	if peers := got[1] + got[2] + got[3]; 6*got[0] >= peers {
		t.Errorf("the restarted backend took %d calls, half its peers' mean (%d) or more: no ramp", got[0], peers/3)
	}
}
