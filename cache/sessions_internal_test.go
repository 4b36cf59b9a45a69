package cache

import (
	"testing"
	"time"
	"unsafe"
)

// SessionEntryBytes is what the byte limits divide by and what the docs
// quote (2 MiB for the default table); it must stay the size of a slot.
func TestSessionEntryBytesIsTheSlotSize(t *testing.T) {
	if got := unsafe.Sizeof(sessionSlot{}); got != SessionEntryBytes {
		t.Fatalf("a session slot takes %d bytes, SessionEntryBytes says %d", got, SessionEntryBytes)
	}
}

type stepClock struct{ now time.Time }

func (c *stepClock) Now() time.Time { return c.now }

// SessionOptions.TTL: a Get within TTL/8 of the last refresh does not move
// the expiry, so the session goes TTL after that refresh, not after the Get.
func TestSessionsTTLResolution(t *testing.T) {
	clock := &stepClock{now: time.Unix(1_800_000_000, 0)}
	s, err := NewSessions(SessionOptions{MaxEntries: 8, TTL: 80 * time.Second, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	s.Put(1, 10)
	clock.now = clock.now.Add(10 * time.Second) // TTL/8: no refresh
	if _, ok := s.Get(1); !ok {
		t.Fatal("miss at 10s")
	}
	clock.now = clock.now.Add(70 * time.Second) // 80s after the Put, 70s after the Get
	if _, ok := s.Get(1); ok {
		t.Fatal("a Get within TTL/8 of the Put moved the expiry")
	}
	s.Put(2, 20)
	clock.now = clock.now.Add(11 * time.Second) // past TTL/8: refreshed
	if _, ok := s.Get(2); !ok {
		t.Fatal("miss at 11s")
	}
	clock.now = clock.now.Add(79 * time.Second)
	if _, ok := s.Get(2); !ok {
		t.Fatal("a Get past TTL/8 did not refresh the session")
	}
}
