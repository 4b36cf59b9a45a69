package httpbalancer

import (
	"bytes"
	"cmp"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inferlb/inferlb/cache"
)

// Conversations on the Responses API (/v1/responses) continue by reference:
// a follow-up sends only its new input and names the response it follows
// (previous_response_id), and the server prepends the stored conversation.
// Keyed on its own input, the follow-up would land anywhere; vLLM and
// SGLang keep stored responses in the memory of the server that made them,
// so it would miss that server's KV cache and may not find the response at
// all. So the Transport remembers, for the responses it sees, the affinity
// key of the request that produced each one and the endpoint that made it.
// A follow-up naming one goes to that endpoint while it can take the call
// (balancer.PickAt: whatever its load, since elsewhere the stored response
// may not exist), else where that key goes: every turn of the conversation
// carries the key of its first turn. Only this process's responses are
// known; a follow-up naming another's is keyed on its input.

// DefaultResponseMemory is how long a Transport remembers the affinity key
// behind a /v1/responses response (Options.ResponseMemory).
const DefaultResponseMemory = 30 * time.Minute

// ResponseEntries is the default size of the table of remembered responses:
// 16,384 entries of 32 bytes (512 KiB), two per response (its key, its
// endpoint), allocated on the first /v1/responses call. When it is full,
// the least recently used entry of a set makes room. That holds the 8,192
// most recent responses: a Transport passing more than about 4.5 new
// responses a second forgets them before DefaultResponseMemory ends, and
// their follow-ups go wherever their input's key goes (where, on vLLM and
// SGLang, the stored response is not); size it with Options.MaxResponses.
const ResponseEntries = 1 << 14

// MaxMaxResponses bounds Options.MaxResponses: 4 Mi responses, a 256 MiB
// table.
const MaxMaxResponses = 1 << 22

// responseChains maps a response ID (its Keyer.Session hash) to the
// affinity key of the request that produced it. The table is allocated on
// first use: most Transports never see the Responses API.
//
// Concurrency: ttl and clock are immutable; the table is created once
// (once) and is safe for concurrent use.
type responseChains struct {
	ttl     time.Duration
	entries int // table size in entries, two per response
	clock   cache.Clock
	once    sync.Once
	table   *cache.Sessions
}

func (r *responseChains) sessions() *cache.Sessions {
	r.once.Do(func() {
		// Up to a power of two: Sessions rounds down, and a table sized
		// for MaxResponses must hold that many.
		entries := 1 << bits.Len(uint(cmp.Or(r.entries, ResponseEntries)-1))
		s, err := cache.NewSessions(cache.SessionOptions{TTL: r.ttl, MaxEntries: entries, MaxBytes: entries * cache.SessionEntryBytes, Clock: r.clock})
		if err != nil {
			panic(err) // the options were validated
		}
		r.table = s
	})
	return r.table
}

// pinSalt keys the second entry of a response: the serial of the endpoint
// that made it.
const pinSalt = 0x9e3779b97f4a7c15

// lookup returns the affinity key remembered for response id hash h and
// the serial of the endpoint that made the response (0 when forgotten).
func (r *responseChains) lookup(h uint64) (key uint64, serial uint32, ok bool) {
	if r == nil || h == 0 {
		return 0, 0, false
	}
	t := r.sessions()
	if key, ok = t.Get(h); !ok {
		return 0, 0, false
	}
	if s, ok := t.Get(h ^ pinSalt); ok {
		serial = uint32(s)
	}
	return key, serial, true
}

// remember records that the response with id hash h was made by the
// endpoint with the given serial for a call routed with key.
func (r *responseChains) remember(h, key, serial uint64) {
	if r != nil && h != 0 && key != 0 {
		t := r.sessions()
		t.Put(h, key)
		if serial != 0 && serial <= math.MaxUint32 {
			t.Put(h^pinSalt, serial)
		}
	}
}

// idCapture finds the response ID at the start of a /v1/responses answer:
// the first string value of an "id" key, which in a JSON response is the
// response's own and in a stream is the one inside the first event
// (response.created). It looks at the first len(buf) bytes only.
//
// Concurrency: feed runs from the body's Read, one goroutine at a time,
// and alone touches buf, n and done; the ID is published through found,
// which finish may load from a Close on another goroutine.
type idCapture struct {
	buf   [512]byte
	n     int
	done  bool
	found atomic.Pointer[string] // the ID, once found
}

func (c *idCapture) feed(p []byte) {
	if c.done {
		return
	}
	c.n += copy(c.buf[c.n:], p)
	id, complete := findID(c.buf[:c.n])
	switch {
	case id != nil:
		s := string(id)
		c.found.Store(&s)
		c.done = true
	case complete || c.n == len(c.buf):
		c.done = true // no ID where one would be
	}
}

// id returns the ID found so far, or "".
func (c *idCapture) id() string {
	if p := c.found.Load(); p != nil {
		return *p
	}
	return ""
}

// maxResponseID bounds the IDs remembered; servers use 30-60 characters.
const maxResponseID = 256

// findID returns the value of the first "id" key with a string value in b,
// or nil; complete is false while b may end inside the match.
func findID(b []byte) (id []byte, complete bool) {
	for from := 0; ; {
		i := bytes.Index(b[from:], []byte(`"id"`))
		if i < 0 {
			return nil, false
		}
		j := skipSpace(b, from+i+4)
		if j == len(b) {
			return nil, false
		}
		if b[j] != ':' {
			from = j
			continue
		}
		j = skipSpace(b, j+1)
		if j == len(b) {
			return nil, false
		}
		if b[j] != '"' {
			from = j // not a string: an "id" of something else
			continue
		}
		k := bytes.IndexByte(b[j+1:], '"')
		if k < 0 {
			return nil, len(b)-j-1 > maxResponseID
		}
		v := b[j+1 : j+1+k]
		if len(v) == 0 || len(v) > maxResponseID || bytes.IndexByte(v, '\\') >= 0 {
			return nil, true
		}
		return v, true
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
