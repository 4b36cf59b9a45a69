package fleetsim

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/inferlb/inferlb"
)

// Content IDs are drawn from disjoint ranges per kind so unrelated segments
// never collide.
func contentID(kind, a, b uint64) uint64 { return mix64(kind<<56 ^ a<<28 ^ b) }

// poisson schedules arrivals with exponential gaps at rate per second until
// the arrival window closes; each arrival calls emit.
func poisson(s Sim, rng *rand.Rand, rate float64, emit func()) {
	if rate <= 0 {
		return
	}
	var next func()
	next = func() {
		if s.Stopped() {
			return
		}
		emit()
		s.After(expDuration(rng, 1/rate), next)
	}
	s.After(expDuration(rng, 1/rate), next)
}

func expDuration(rng *rand.Rand, mean float64) time.Duration {
	return time.Duration(rng.ExpFloat64() * mean * float64(time.Second))
}

func uniform(rng *rand.Rand, lo, hi int) int { return lo + rng.IntN(hi-lo+1) }

// unitFloat maps a 64-bit hash to [0, 1).
func unitFloat(x uint64) float64 { return float64(x>>11) / (1 << 53) }

// SharedPrefix is llm-d's prefix-cache benchmark workload
// (https://llm-d.ai/blog/kvcache-wins-you-can-see, generated with
// inference-perf's shared_prefix data type): Groups groups (customers) of
// Users users each; a group shares a long context (a document, a system
// prompt) and each user asks a fixed question about it. Requests pick a
// group and a user uniformly, so prompts repeat, and arrive as a Poisson
// process.
type SharedPrefix struct {
	Groups, Users             int
	Context, Question, Output int
	Rate                      float64
	prompts                   [][]*Prompt
	rng                       *rand.Rand
	answers                   uint64
	keys                      []uint64
}

// Start implements Workload.
func (w *SharedPrefix) Start(s Sim) {
	w.rng = s.Rand(1)
	w.prompts = make([][]*Prompt, w.Groups)
	w.keys = make([]uint64, w.Groups)
	for g := range w.Groups {
		w.prompts[g] = make([]*Prompt, w.Users)
		// Sent as one plain prompt, context first: the key covers the
		// start of the shared context, so a group shares one key.
		w.keys[g] = promptKey(w.context(g))
	}
	poisson(s, w.rng, w.Rate, func() {
		g, u := w.rng.IntN(w.Groups), w.rng.IntN(w.Users)
		p := w.prompts[g][u]
		if p == nil {
			p = NewPrompt(
				w.context(g),
				Segment{contentID(2, uint64(g), uint64(u)), w.Question})
			w.prompts[g][u] = p
		}
		w.answers++
		s.Submit(&Request{
			Service: inferlb.ServiceLLM, Model: Model, Prompt: p,
			OutputTokens: w.Output, MaxOutputTokens: w.Output,
			AnswerID: contentID(3, w.answers, 0), AffinityKey: w.keys[g],
		})
	})
}

func (w *SharedPrefix) context(g int) Segment { return Segment{contentID(1, uint64(g), 0), w.Context} }

// Done implements Workload.
func (w *SharedPrefix) Done(Sim, *Request, bool) {}

// Chat is multi-turn conversations: each session opens with one of Apps
// system prompts, then alternates user messages and answers; every turn
// resends the whole history, so each turn's prompt extends the previous
// turn's prompt and answer. The next turn is sent after the answer plus a
// think time, so the load is closed-loop per session. Sessions start as a
// Poisson process at Rate / mean turns, so Rate is in requests per second.
type Chat struct {
	Rate                 float64
	Apps, System         int
	MinTurns, MaxTurns   int
	MinUser, MaxUser     int
	MinAnswer, MaxAnswer int
	Think                time.Duration
	// Rerender is the share of sessions whose client re-renders the
	// history it resends (a chat template that strips the reasoning of
	// past turns, reformatted tool calls, re-tokenized text): the answer
	// it quotes is not the token sequence the server generated, so a
	// follow-up's prompt matches the server's cache only up to the end of
	// the previous turn's prompt (to the last full block before it), not
	// into the previous answer. The quoted answer keeps the answer's
	// length. Zero means every session quotes each answer token for token,
	// so the whole previous turn, answer included, can hit. The draw is
	// per session, fixed by the seed, and takes nothing from the other
	// random streams, so zero reproduces the workload without the field.
	Rerender float64
	// Adapters, when set, are LoRA adapters of Model: a session asks for
	// one of them (uniformly) with probability AdapterShare, and for Model
	// otherwise; its requests are classed "adapter" or "base". An
	// adapter's prompts are cached apart from the base model's, as vLLM
	// salts the block hashes of a LoRA request with its adapter.
	Adapters     []string
	AdapterShare float64
	// AdapterWeights, when set, are the adapters' relative popularity,
	// by index (the lora-slots scenario's are Zipf's), and
	// AdapterClasses their request classes ("adapter" when nil).
	AdapterWeights []float64
	AdapterClasses []string
	// Tenants, when set, name the tenants that send the sessions
	// (Request.Tenant), each session one of them, drawn by
	// TenantShares (relative; nil: equal). The draw is derived from the
	// session's seed, as Rerender's, and changes no other draw.
	Tenants      []string
	TenantShares []float64
	rng          *rand.Rand
	sessions     uint64
	system       []Segment
}

// chatSession is one conversation. Its turns draw from its own random
// stream: the session stream's draws happen in completion order, which
// routing decides, so drawing them from the arrival stream would let one
// policy's routing change the workload every later session sees.
type chatSession struct {
	id         uint64
	model      string
	class      string
	key        uint64
	turn, last int
	prompt     *Prompt
	rng        *rand.Rand
	rerender   bool   // quotes answers re-rendered (Chat.Rerender)
	tenant     string // Chat.Tenants
}

// quotedAnswer is the answer segment a session's next prompt carries: the
// generated answer itself, or for a re-rendering client other tokens of the
// same length, which match no block the server cached while generating.
func (cs *chatSession) quotedAnswer(req *Request) Segment {
	if cs.rerender {
		return Segment{contentID(16, cs.id, uint64(cs.turn)), req.OutputTokens}
	}
	return Segment{req.AnswerID, req.OutputTokens}
}

// Start implements Workload.
func (w *Chat) Start(s Sim) {
	w.rng = s.Rand(2)
	for a := range w.Apps {
		w.system = append(w.system, Segment{contentID(4, uint64(a), 0), w.System})
	}
	meanTurns := float64(w.MinTurns+w.MaxTurns) / 2
	poisson(s, w.rng, w.Rate/meanTurns, func() {
		w.sessions++
		cs := &chatSession{
			id:    w.sessions,
			model: Model,
			last:  uniform(w.rng, w.MinTurns, w.MaxTurns),
		}
		app := w.rng.IntN(w.Apps)
		sys := w.system[app]
		if len(w.Adapters) > 0 {
			cs.class = "base"
			if w.rng.Float64() < w.AdapterShare {
				k := w.adapter()
				cs.model, cs.class = w.Adapters[k], "adapter"
				if w.AdapterClasses != nil {
					cs.class = w.AdapterClasses[k]
				}
				sys = Segment{contentID(4, uint64(app), uint64(k+1)), w.System}
			}
		}
		cs.prompt = NewPrompt(sys)
		seed := w.rng.Uint64()
		cs.rng = rand.New(rand.NewPCG(seed, cs.id))
		// Derived from the session's seed rather than drawn, so the
		// share changes no other draw.
		cs.rerender = unitFloat(mix64(seed^0x7265726e646572)) < w.Rerender
		cs.tenant = w.tenant(seed)
		w.send(s, cs)
	})
}

// tenant is the tenant of the session whose seed is seed ("" without
// Tenants).
func (w *Chat) tenant(seed uint64) string {
	if len(w.Tenants) == 0 {
		return ""
	}
	shares := w.TenantShares
	var sum float64
	for k := range w.Tenants {
		if shares == nil {
			sum++
		} else {
			sum += shares[k]
		}
	}
	u := unitFloat(mix64(seed^0x74656e616e74)) * sum
	for k, t := range w.Tenants {
		x := 1.0
		if shares != nil {
			x = shares[k]
		}
		if u < x {
			return t
		}
		u -= x
	}
	return w.Tenants[len(w.Tenants)-1]
}

// adapter draws the index of a session's adapter.
func (w *Chat) adapter() int {
	if w.AdapterWeights == nil {
		return w.rng.IntN(len(w.Adapters))
	}
	var sum float64
	for _, x := range w.AdapterWeights {
		sum += x
	}
	u := w.rng.Float64() * sum
	for k, x := range w.AdapterWeights {
		if u < x {
			return k
		}
		u -= x
	}
	return len(w.AdapterWeights) - 1
}

func (w *Chat) send(s Sim, cs *chatSession) {
	cs.turn++
	user := Segment{contentID(5, cs.id, uint64(cs.turn)), uniform(cs.rng, w.MinUser, w.MaxUser)}
	if cs.turn == 1 {
		cs.key = chatKey(cs.model, cs.prompt.Segments[0], user)
	}
	cs.prompt = cs.prompt.Extend(user)
	out := uniform(cs.rng, w.MinAnswer, w.MaxAnswer)
	s.Submit(&Request{
		Service: inferlb.ServiceLLM, Model: cs.model, Class: cs.class, Prompt: cs.prompt,
		OutputTokens: out, MaxOutputTokens: w.MaxAnswer,
		AnswerID: contentID(6, cs.id, uint64(cs.turn)), AffinityKey: cs.key,
		Tenant: cs.tenant, session: cs,
	})
}

// Done implements Workload: the next turn quotes this answer (re-rendered,
// for a session of the Rerender share).
func (w *Chat) Done(s Sim, req *Request, ok bool) {
	cs, _ := req.session.(*chatSession)
	if cs == nil || !ok || cs.turn >= cs.last {
		return
	}
	cs.prompt = cs.prompt.Extend(cs.quotedAnswer(req))
	s.After(expDuration(cs.rng, w.Think.Seconds()), func() {
		if !s.Stopped() {
			w.send(s, cs)
		}
	})
}

// Mix is independent single-turn requests of two sizes: Heavy of them long
// (documents to summarize, long generations), the rest short chat. Prompts
// do not share prefixes; the client still derives a key from each prompt, as
// it would from content, so keys are all distinct.
type Mix struct {
	Rate                  float64
	Heavy                 float64 // fraction of heavy requests
	HeavyPrompt, HeavyOut [2]int  // ranges
	LightPrompt, LightOut [2]int
	rng                   *rand.Rand
	n                     uint64
}

// Start implements Workload.
func (w *Mix) Start(s Sim) {
	w.rng = s.Rand(3)
	poisson(s, w.rng, w.Rate, func() {
		w.n++
		class, pr, out := "light", w.LightPrompt, w.LightOut
		if w.rng.Float64() < w.Heavy {
			class, pr, out = "heavy", w.HeavyPrompt, w.HeavyOut
		}
		o := uniform(w.rng, out[0], out[1])
		seg := Segment{contentID(7, w.n, 0), uniform(w.rng, pr[0], pr[1])}
		s.Submit(&Request{
			Service: inferlb.ServiceLLM, Model: Model, Class: class,
			Prompt: NewPrompt(seg), OutputTokens: o, MaxOutputTokens: out[1],
			AnswerID: contentID(8, w.n, 0), AffinityKey: promptKey(seg),
		})
	})
}

// Done implements Workload.
func (w *Mix) Done(Sim, *Request, bool) {}

// Pooling is embedding and rerank calls: short uniform embedding inputs and
// rerank calls that score Docs query-document pairs at once. Neither carries
// an affinity key: there is no cache to find.
type Pooling struct {
	Rate           float64
	Rerank         float64 // fraction of rerank calls
	EmbedTokens    [2]int
	Docs, DocToken int
	rng            *rand.Rand
	n              uint64
}

// Start implements Workload.
func (w *Pooling) Start(s Sim) {
	w.rng = s.Rand(4)
	poisson(s, w.rng, w.Rate, func() {
		w.n++
		svc, class, tok := inferlb.ServiceEmbedding, "embedding", uniform(w.rng, w.EmbedTokens[0], w.EmbedTokens[1])
		if w.rng.Float64() < w.Rerank {
			svc, class, tok = inferlb.ServiceRerank, "rerank", w.Docs*w.DocToken
		}
		s.Submit(&Request{
			Service: svc, Class: class,
			Prompt: NewPrompt(Segment{contentID(9, w.n, 0), tok}),
		})
	})
}

// Done implements Workload.
func (w *Pooling) Done(Sim, *Request, bool) {}

// HotPrompt is traffic where a Hot fraction of requests carries the same
// long system prompt (one popular application) followed by a unique user
// message, and the rest are unrelated prompts. The requests are plain
// prompts (completions API), whose key covers only the first Depth
// characters, so every hot request has the same key: affinity alone would
// send half the traffic to one replica, and the load bound must spill it.
type HotPrompt struct {
	Rate                float64
	Hot                 float64
	System              int
	User, Other, Output [2]int
	rng                 *rand.Rand
	n                   uint64
	hotKey              uint64
	sys                 Segment
}

// Start implements Workload.
func (w *HotPrompt) Start(s Sim) {
	w.rng = s.Rand(5)
	w.sys = Segment{contentID(10, 0, 0), w.System}
	w.hotKey = promptKey(w.sys)
	poisson(s, w.rng, w.Rate, func() {
		w.n++
		out := uniform(w.rng, w.Output[0], w.Output[1])
		req := &Request{
			Service: inferlb.ServiceLLM, Model: Model, OutputTokens: out, MaxOutputTokens: w.Output[1],
			AnswerID: contentID(11, w.n, 0),
		}
		if w.rng.Float64() < w.Hot {
			req.Class = "hot"
			req.Prompt = NewPrompt(w.sys, Segment{contentID(12, w.n, 0), uniform(w.rng, w.User[0], w.User[1])})
			req.AffinityKey = w.hotKey
		} else {
			req.Class = "other"
			seg := Segment{contentID(13, w.n, 0), uniform(w.rng, w.Other[0], w.Other[1])}
			req.Prompt = NewPrompt(seg)
			req.AffinityKey = promptKey(seg)
		}
		s.Submit(req)
	})
}

// Done implements Workload.
func (w *HotPrompt) Done(Sim, *Request, bool) {}

// Tenants is several tenants sharing one fleet while one of them floods it:
// each of Quiet tenants sends chat requests behind its own system prompt at
// QuietRate; the noisy tenant sends NoisyRate requests with long unique
// prompts and long answers (a batch job gone wild, or abuse).
type Tenants struct {
	Quiet                    int
	QuietRate, NoisyRate     float64
	System, Question, Answer int // quiet requests, in tokens
	NoisyPrompt, NoisyOut    int
	rng                      *rand.Rand
	n                        uint64
}

// Start implements Workload.
func (w *Tenants) Start(s Sim) {
	w.rng = s.Rand(5)
	for t := range w.Quiet {
		name := fmt.Sprintf("tenant-%d", t)
		sys := Segment{contentID(10, uint64(t), 0), w.System}
		poisson(s, w.rng, w.QuietRate, func() {
			w.n++
			q := Segment{contentID(11, w.n, 0), w.Question}
			s.Submit(&Request{
				Service: inferlb.ServiceLLM, Model: Model, Class: "quiet", Tenant: name,
				Prompt: NewPrompt(sys, q), OutputTokens: w.Answer, MaxOutputTokens: w.Answer,
				AnswerID: contentID(12, w.n, 0), AffinityKey: chatKey(Model, sys, q),
			})
		})
	}
	poisson(s, w.rng, w.NoisyRate, func() {
		w.n++
		seg := Segment{contentID(13, w.n, 0), w.NoisyPrompt}
		s.Submit(&Request{
			Service: inferlb.ServiceLLM, Model: Model, Class: "noisy", Tenant: "noisy",
			Prompt: NewPrompt(seg), OutputTokens: w.NoisyOut, MaxOutputTokens: w.NoisyOut,
			AnswerID: contentID(14, w.n, 0), AffinityKey: promptKey(seg),
		})
	})
}

// Done implements Workload.
func (w *Tenants) Done(Sim, *Request, bool) {}
