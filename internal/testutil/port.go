package testutil

import (
	"io"
	"net"
	"net/netip"
	"testing"
)

// A PortHold keeps a loopback TCP port for a test with a socket that is
// bound to it and does not listen. A connection to a port held so is
// refused at once (the kernel answers its SYN with a reset, as for any
// port with no listener), and no other listener can have the port while
// the hold lasts: until the test ends.
//
// A port found free and closed again (listen on :0, Close, use the
// address) is free for anyone: tests run in parallel across packages, and
// another test's listener on :0 may be given the same port, after which a
// test that means to dial a dead address talks to a live stranger, and
// one that restarts a server where it was finds the port taken. (On
// Linux, 60,000 listeners on :0 were given such freed ports 2,655 times,
// held ones never.) A held port is never given to a listener on :0, and
// net.Listen on it by number fails with EADDRINUSE.
//
// A server the test runs on the port listens with PortHold.Listen: a
// fresh socket, as a restarted server's would be, that shares the port
// with the hold through SO_REUSEPORT, set on both and on no listener the
// net package opens; Linux gives connections to listening sockets only,
// so the hold takes none of the server's. Killed (its listener closed),
// the server leaves the port held, refusing connections; restarted, it
// listens on it again. The port is never free in between, so a restart
// needs no retry and cannot meet a stranger, as one could that closed a
// hold taken at the kill and listened in its place. The hold's own socket
// could listen instead, but it could not stop listening and keep the
// port.
//
// Ports are held on Linux only, where all this is tested; on BSD-derived
// kernels a bound socket may be found for a SYN before a listener sharing
// its port. Elsewhere a PortHold holds nothing: HoldPort finds a free port
// as the tests did before, and Listen listens on it with net.Listen.
type PortHold struct {
	addr string
	sock io.Closer // the bound socket; nil where ports are not held
}

// HoldPort holds a fresh port on 127.0.0.1 until the test ends.
func HoldPort(t testing.TB) *PortHold {
	t.Helper()
	lo := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), 0)
	sock, bound, err := bindHeld(lo)
	if err != nil {
		t.Fatalf("testutil: holding a port: %v", err)
	}
	if sock != nil {
		t.Cleanup(func() { _ = sock.Close() })
	}
	return &PortHold{addr: bound.String(), sock: sock}
}

// RefusedAddr returns a loopback address every connection to which is
// refused until the test ends: a held port nothing listens on (see
// PortHold).
func RefusedAddr(t testing.TB) string {
	t.Helper()
	return HoldPort(t).Addr()
}

// Addr returns the held address, as host:port.
func (h *PortHold) Addr() string { return h.addr }

// Listen opens a listener on the held port. The port stays held when the
// listener closes, and Listen may be called again then, as a server
// restarts where it was; one listener at a time.
func (h *PortHold) Listen() (net.Listener, error) { return listenShared(h.addr) }
