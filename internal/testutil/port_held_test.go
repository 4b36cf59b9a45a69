//go:build linux

package testutil_test

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/inferlb/inferlb/internal/testutil"
)

// dialTimeout bounds each dial: a refused one ends at once, and one that
// timed out instead (a port that drops SYNs) fails the test as not refused.
const dialTimeout = 10 * time.Second

// refused fails the test unless a connection to addr is refused.
func refused(t *testing.T, addr, what string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err == nil {
		_ = c.Close()
		t.Fatalf("%s: a connection to %s was accepted, want refused", what, addr)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("%s: dial %s: %v, want ECONNREFUSED", what, addr, err)
	}
}

// served fails the test unless l accepts a connection to its address.
func served(t *testing.T, l net.Listener, what string) {
	t.Helper()
	accepted := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			_ = c.Close()
		}
		accepted <- err
	}()
	c, err := net.DialTimeout("tcp", l.Addr().String(), dialTimeout)
	if err != nil {
		t.Fatalf("%s: dial %s: %v", what, l.Addr(), err)
	}
	_ = c.Close()
	if err := <-accepted; err != nil {
		t.Fatalf("%s: accept: %v", what, err)
	}
}

// untaken fails the test unless a listener as any other test opens one
// (net.Listen) cannot have addr's port.
func untaken(t *testing.T, addr, what string) {
	t.Helper()
	for _, network := range []string{"tcp", "tcp4"} {
		l, err := net.Listen(network, addr)
		if err == nil {
			_ = l.Close()
			t.Fatalf("%s: net.Listen(%q, %s) took the held port", what, network, addr)
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatalf("%s: net.Listen(%q, %s): %v, want EADDRINUSE", what, network, addr, err)
		}
	}
}

func TestRefusedAddrRefusesAndCannotBeTaken(t *testing.T) {
	seen := map[string]bool{}
	for range 16 {
		a := testutil.RefusedAddr(t)
		if seen[a] {
			t.Fatalf("RefusedAddr gave %s twice in one test", a)
		}
		seen[a] = true
		refused(t, a, "held")
		untaken(t, a, "held")
	}
}

// A server brought up on a held port and taken down again: it is given
// the connections while it listens, and between its lives the port
// refuses them and stays the test's.
func TestHeldPortListensAgainAndAgain(t *testing.T) {
	h := testutil.HoldPort(t)
	for i := range 3 {
		l, err := h.Listen()
		if err != nil {
			t.Fatalf("life %d: listen on the held port: %v", i, err)
		}
		if l.Addr().String() != h.Addr() {
			t.Fatalf("life %d: listening on %s, want the held %s", i, l.Addr(), h.Addr())
		}
		served(t, l, "up")
		untaken(t, h.Addr(), "up")
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		refused(t, h.Addr(), "down")
		untaken(t, h.Addr(), "down")
	}
}
