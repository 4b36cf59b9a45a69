//go:build linux

package testutil

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// bindHeld binds a new TCP socket with SO_REUSEPORT set to ap, and leaves
// it not listening. SO_REUSEADDR stays off: on Linux it would let any
// listener that sets it (net.Listen's) bind the port too while the hold
// does not listen; with SO_REUSEPORT alone only a listener that sets it
// too, as listenShared's, shares the port.
func bindHeld(ap netip.AddrPort) (io.Closer, netip.AddrPort, error) {
	// As the net package does: no exec in between may inherit the socket,
	// which would hold the port past the test.
	syscall.ForkLock.RLock()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	if err == nil {
		unix.CloseOnExec(fd)
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, ap, fmt.Errorf("socket: %w", err)
	}
	sock := os.NewFile(uintptr(fd), "held port "+ap.String())
	fail := func(op string, err error) (io.Closer, netip.AddrPort, error) {
		_ = sock.Close()
		return nil, ap, fmt.Errorf("%s: %w", op, err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		return fail("setsockopt SO_REUSEPORT", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
		return fail("bind", err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return fail("getsockname", err)
	}
	in4, ok := sa.(*unix.SockaddrInet4)
	if !ok {
		return fail("getsockname", fmt.Errorf("a %T", sa))
	}
	return sock, netip.AddrPortFrom(netip.AddrFrom4(in4.Addr), uint16(in4.Port)), nil
}

// listenShared listens on addr with SO_REUSEPORT set (and SO_REUSEADDR,
// which the net package sets on every listener), sharing the port with its
// hold.
func listenShared(addr string) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	return lc.Listen(context.Background(), "tcp4", addr)
}
