package fleetsim

import (
	"container/heap"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scriptSim drives a Workload alone on the simulator's event queue: each
// request completes after a delay the test chooses, which stands in for how
// a routing policy serves it.
type scriptSim struct {
	now    time.Duration
	stop   time.Duration
	seed   uint64
	events eventQueue
	seq    uint64
	delay  func(n int) time.Duration // completion delay of the n-th request
	w      Workload
	sent   map[uint64]*Request // by AnswerID
	n      int
}

func (s *scriptSim) Now() time.Duration { return s.now }
func (s *scriptSim) After(d time.Duration, fn func()) {
	s.seq++
	heap.Push(&s.events, event{at: s.now + d, seq: s.seq, fn: fn})
}
func (s *scriptSim) Rand(stream uint64) *rand.Rand { return rand.New(rand.NewPCG(s.seed, stream)) }
func (s *scriptSim) Stopped() bool                 { return s.now >= s.stop }
func (s *scriptSim) Submit(req *Request) {
	s.sent[req.AnswerID] = req
	d := s.delay(s.n)
	s.n++
	s.After(d, func() { s.w.Done(s, req, true) })
}

func (s *scriptSim) run() {
	s.w.Start(s)
	for s.events.Len() > 0 {
		e := heap.Pop(&s.events).(event)
		s.now = e.at
		e.fn()
	}
}

// The chat workload is closed-loop: a session's next turn follows its
// answer, so how fast a policy answers decides when turns come, and which
// turns fit in the window. What each turn says (message and answer
// lengths, think times) must not depend on it, or comparing two policies
// on one seed would compare two workloads.
func TestChatTurnsDoNotDependOnRouting(t *testing.T) {
	runWith := func(delay func(int) time.Duration) map[uint64]*Request {
		s := &scriptSim{stop: 120 * time.Second, seed: 7, delay: delay, sent: map[uint64]*Request{},
			w: &Chat{Rate: 10, Apps: 2, System: 500, MinTurns: 2, MaxTurns: 6,
				MinUser: 20, MaxUser: 400, MinAnswer: 10, MaxAnswer: 600, Think: time.Second}}
		s.run()
		return s.sent
	}
	// Two "policies": one answers every call in 2 s; the other answers
	// alternate calls in 0.5 s and 6 s, which reorders completions.
	a := runWith(func(int) time.Duration { return 2 * time.Second })
	b := runWith(func(n int) time.Duration {
		if n%2 == 0 {
			return 500 * time.Millisecond
		}
		return 6 * time.Second
	})
	common := 0
	for id, ra := range a {
		rb, ok := b[id]
		if !ok {
			continue
		}
		common++
		require.Equal(t, ra.Prompt.Tokens, rb.Prompt.Tokens, "turn %x: prompt", id)
		require.Equal(t, ra.OutputTokens, rb.OutputTokens, "turn %x: answer", id)
		require.Equal(t, ra.AffinityKey, rb.AffinityKey, "turn %x: key", id)
	}
	assert.Greater(t, common, len(a)*3/4, "most turns are sent under both (%d of %d and %d)", common, len(a), len(b))
}
