package fleetsim

import (
	"container/heap"
	"errors"
	"math"
	"strings"
	"sync"
	"time"
)

// LiveServer runs one simulated replica in scaled real time, so programs can
// send it real requests: examples/quickstart serves an OpenAI-compatible API
// from it. Speedup compresses time: at 4, a step the model prices at 40ms
// takes 10ms of wall time, and every latency a client measures is 1/4 of
// the model's. It is safe for concurrent use.
type LiveServer struct {
	mu      sync.Mutex // guards sim, rep, the event queue and closed
	sim     *run
	rep     *replica
	start   time.Time
	speedup float64
	answers uint64
	closed  bool // set by Close once the loop is gone: no call is queued after it
	kvCap   int  // KV cache in tokens (whole blocks); immutable

	wake      chan struct{}
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// ErrStopped is returned for calls cut short by Close.
var ErrStopped = errors.New("fleetsim: live server stopped")

// ErrTooLong is returned for a call whose prompt and answer together need
// more KV cache than the replica has, as vLLM refuses (400) a request longer
// than its context: queued, it could never be admitted.
var ErrTooLong = errors.New("fleetsim: prompt and max tokens exceed the KV cache")

// NewLiveServer starts a replica with params p and step-time multiplier
// speed, running speedup times faster than the wall clock.
func NewLiveServer(p ServerParams, speed, speedup float64) *LiveServer {
	l := &LiveServer{
		speedup: max(speedup, 1e-3),
		start:   time.Now(),
		wake:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	l.sim = &run{sc: &Scenario{}, cfg: RunConfig{Duration: 1 << 62}, classE2E: map[string][]float64{}}
	l.rep = newReplica(0, "live", p, max(speed, 1e-3), l.sim)
	l.kvCap = len(l.rep.kv.ref) * BlockSize
	go l.loop()
	return l
}

// vnow is the model time now. Called with mu held.
func (l *LiveServer) vnow() time.Duration {
	return time.Duration(float64(time.Since(l.start)) * l.speedup)
}

// advance runs every event due by now. Called with mu held.
func (l *LiveServer) advance() time.Duration {
	now := l.vnow()
	for l.sim.events.Len() > 0 && l.sim.events[0].at <= now {
		ev := heap.Pop(&l.sim.events).(event)
		l.sim.now = ev.at
		ev.fn()
	}
	l.sim.now = max(l.sim.now, now)
	if l.sim.events.Len() == 0 {
		return time.Hour
	}
	return time.Duration(float64(l.sim.events[0].at-now) / l.speedup)
}

func (l *LiveServer) loop() {
	defer close(l.done)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		l.mu.Lock()
		wait := l.advance()
		l.mu.Unlock()
		t.Reset(wait)
		select {
		case <-t.C:
		case <-l.wake:
		case <-l.stop:
			return
		}
	}
}

// Token is one event of a generation: the index of a produced token (from
// 1), or the end of the call with its error (nil for success).
type Token struct {
	N   int
	End bool
	Err error
}

// Generate submits a prompt that will produce outTokens tokens (at least
// one) and returns the channel its tokens arrive on; the last value has End
// set. The channel is buffered for the whole answer, so a slow reader never
// stalls the engine. A call after Close ends with ErrStopped, and one that
// needs more KV cache than the replica has with ErrTooLong, both at once.
func (l *LiveServer) Generate(p *Prompt, outTokens int) <-chan Token {
	outTokens = max(outTokens, 1)
	// The last token is never stored, so a call holds at most its prompt
	// and outTokens-1 answer tokens in KV cache (written to avoid overflow).
	if outTokens-1 > l.kvCap-p.Tokens {
		return ended(ErrTooLong)
	}
	ch := make(chan Token, outTokens+1)
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ended(ErrStopped)
	}
	l.advance()
	l.answers++
	j := &job{
		req:        &Request{Prompt: p, OutputTokens: outTokens, MaxOutputTokens: outTokens, AnswerID: mix64(l.answers ^ 0xa115)},
		arrive:     l.sim.now,
		firstToken: -1,
		onToken:    func(n int) { ch <- Token{N: n} },
		onEnd:      func(err error) { ch <- Token{End: true, Err: err}; close(ch) },
	}
	j.start = j.arrive
	if !l.rep.enqueue(j) {
		ch <- Token{End: true, Err: errThrottled}
		close(ch)
	}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return ch
}

// ended returns a channel holding only the end of a call, with err.
func ended(err error) <-chan Token {
	ch := make(chan Token, 1)
	ch <- Token{End: true, Err: err}
	close(ch)
	return ch
}

// LiveStats is a live server's load and cache counters.
type LiveStats struct {
	Running, Waiting int
	KVCacheUsage     float64
	// HitTokens and QueryTokens count prompt tokens found in and looked up
	// in the prefix cache since the start.
	HitTokens, QueryTokens int64
	// Busy is the model time spent in engine steps.
	Busy time.Duration
}

// Stats returns the current counters.
func (l *LiveServer) Stats() LiveStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return LiveStats{
		Running: len(l.rep.running), Waiting: len(l.rep.waiting), KVCacheUsage: l.rep.kv.usage(),
		HitTokens: l.rep.hitTokens, QueryTokens: l.rep.queryTokens, Busy: l.rep.busy,
	}
}

// Close stops the engine; calls in progress, and any made later, end with
// ErrStopped. It may be called more than once and from several goroutines;
// each call returns once the calls in progress have ended.
func (l *LiveServer) Close() {
	l.closeOnce.Do(func() {
		close(l.stop)
		<-l.done
		l.mu.Lock()
		defer l.mu.Unlock()
		l.closed = true
		for _, s := range append(l.rep.running, l.rep.waiting...) {
			s.job.onEnd(ErrStopped)
		}
		l.rep.running, l.rep.waiting = nil, nil
	})
}

// TextTokens turns text into synthetic tokens, one per 4 bytes (about what
// a BPE tokenizer makes of English), each a hash of its bytes, so equal text
// prefixes give equal token prefixes.
func TextTokens(text string) []uint64 {
	out := make([]uint64, 0, (len(text)+charsPerToken-1)/charsPerToken)
	for i := 0; i < len(text); i += charsPerToken {
		var v uint64
		for _, c := range []byte(text[i:min(i+charsPerToken, len(text))]) {
			v = v<<8 | uint64(c)
		}
		out = append(out, mix64(v+0x7e47))
	}
	return out
}

// Text renders segments as synthetic text, 4 characters per token: the
// content a program sends a live server.
func Text(segs ...Segment) string {
	var b strings.Builder
	render(&b, math.MaxInt, segs...) // no limit
	return b.String()
}
