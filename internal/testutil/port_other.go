//go:build !linux

package testutil

import (
	"io"
	"net"
	"net/netip"
)

// bindHeld holds nothing here (see PortHold): for port 0 it finds a free
// port by listening on it and closing the listener.
func bindHeld(ap netip.AddrPort) (io.Closer, netip.AddrPort, error) {
	if ap.Port() != 0 {
		return nil, ap, nil
	}
	l, err := net.Listen("tcp4", ap.String())
	if err != nil {
		return nil, ap, err
	}
	bound := l.Addr().(*net.TCPAddr).AddrPort()
	return nil, bound, l.Close()
}

func listenShared(addr string) (net.Listener, error) { return net.Listen("tcp4", addr) }
