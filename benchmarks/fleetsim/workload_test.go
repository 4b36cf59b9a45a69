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
	order  []*Request          // in submission order
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
	s.order = append(s.order, req)
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

// followUp is one turn of a chat session and the turn that follows it.
type followUp struct {
	prev, next *Request
	rerender   bool
}

// chatFollowUps runs w alone and pairs each chat turn with its session's next.
func chatFollowUps(t *testing.T, w *Chat) []followUp {
	t.Helper()
	s := &scriptSim{stop: 300 * time.Second, seed: 11, delay: func(int) time.Duration { return time.Second },
		sent: map[uint64]*Request{}, w: w}
	s.run()
	last := map[*chatSession]*Request{}
	var out []followUp
	for _, req := range s.order {
		cs := req.session.(*chatSession)
		if prev := last[cs]; prev != nil {
			out = append(out, followUp{prev, req, cs.rerender})
		}
		last[cs] = req
	}
	require.NotEmpty(t, out)
	return out
}

// cachedHit is how many leading blocks of next's prompt a server finds in
// its prefix cache after serving prev alone: prev's prompt blocks and the
// full blocks of its answer, hashed over the prompt-plus-answer stream as
// the server hashes them (replica.answerBlockHash), looked up in a block
// pool as the scheduler does.
func cachedHit(prev, next *Request) int {
	pool := newBlockPool(4096)
	var h blockHasher
	for i := range prev.Prompt.Tokens + prev.OutputTokens {
		if bh, ok := h.add(prev.Prompt.tokenAt(i, prev.AnswerID)); ok {
			b, _ := pool.alloc(1, nil)
			pool.register(b[0], bh)
		}
	}
	hit, _ := pool.lookup(next.Prompt.Hashes)
	return hit
}

func testChat(rerender float64) *Chat {
	return &Chat{Rate: 10, Apps: 2, System: 500, MinTurns: 2, MaxTurns: 6,
		MinUser: 20, MaxUser: 400, MinAnswer: 10, MaxAnswer: 600, Think: time.Second, Rerender: rerender}
}

// A session whose client re-renders its history quotes answers the server
// did not generate token for token: the follow-up finds the previous
// prompt's full blocks cached, and nothing from the block where the answer
// starts on.
func TestChatRerenderedFollowUpHitsOnlyUpToThePreviousPrompt(t *testing.T) {
	t.Parallel()
	for _, f := range chatFollowUps(t, testChat(1)) {
		require.True(t, f.rerender)
		p, o := f.prev.Prompt.Tokens, f.prev.OutputTokens
		require.Equal(t, p/BlockSize, cachedHit(f.prev, f.next), "prompt %d + answer %d tokens", p, o)
		require.Greater(t, f.next.Prompt.Tokens, p+o, "the quoted answer keeps its length")
	}
}

// With the default share, a session that does not re-render still finds
// the whole previous turn cached, answer included, up to its last full
// block; about ChatRerender of the sessions re-render. The share is drawn
// apart from every other random stream, so the turns themselves (lengths,
// keys) are those of the workload without re-rendering.
func TestChatDefaultShareKeepsTheAnswerHitForOtherSessions(t *testing.T) {
	t.Parallel()
	require.Equal(t, ChatRerender, ChatScenario().Workload(10).(*Chat).Rerender)
	fs := chatFollowUps(t, testChat(ChatRerender))
	sessions := map[*chatSession]bool{}
	for _, f := range fs {
		p, o := f.prev.Prompt.Tokens, f.prev.OutputTokens
		sessions[f.prev.session.(*chatSession)] = f.rerender
		want := (p + o) / BlockSize
		if f.rerender {
			want = p / BlockSize
		}
		require.Equal(t, want, cachedHit(f.prev, f.next), "rerender %v: prompt %d + answer %d tokens", f.rerender, p, o)
	}
	n := 0
	for _, r := range sessions {
		if r {
			n++
		}
	}
	share := float64(n) / float64(len(sessions))
	assert.InDelta(t, ChatRerender, share, 0.1, "%d of %d sessions re-render", n, len(sessions))

	old := chatFollowUps(t, testChat(0))
	require.Len(t, old, len(fs))
	for i, f := range old {
		assert.False(t, f.rerender)
		assert.Equal(t, f.next.AnswerID, fs[i].next.AnswerID)
		assert.Equal(t, f.next.Prompt.Tokens, fs[i].next.Prompt.Tokens)
		assert.Equal(t, f.next.OutputTokens, fs[i].next.OutputTokens)
		assert.Equal(t, f.next.AffinityKey, fs[i].next.AffinityKey)
	}
}

// The command's -chat-rerender reaches every chat workload, derived
// scenarios' included, and leaves other workloads alone.
func TestSetChatRerender(t *testing.T) {
	for _, sc := range []*Scenario{ChatScenario(), LoRAScenario(), DPChatScenario(), PartialTelemetryScenario()} {
		sc.SetChatRerender(0)
		assert.Zero(t, sc.Workload(10).(*Chat).Rerender, sc.Name)
	}
	sc := SharedPrefixScenario()
	sc.SetChatRerender(1)
	assert.IsType(t, &SharedPrefix{}, sc.Workload(10))
}
