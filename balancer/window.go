package balancer

import (
	"math"
	"slices"
	"time"

	"github.com/inferlb/inferlb"
	ctxwindow "github.com/inferlb/inferlb/internal/window"
)

// Context windows.
//
// Replicas of one model may take prompts of different lengths: started
// with different max-model-len, or on GPUs with room for different KV
// caches. One that refuses a call as longer than its window (Outcome.
// ContextWindow) says so before any work, and another may take the call.
// The balancer remembers each endpoint's window per model for
// windowMemory, and a pick whose request does not fit an endpoint's
// remembered window (Request.Tokens, the prompt and the output asked for,
// above it) passes that endpoint over while another can take the call:
// another not remembered not to serve the model (notserved.go), whose
// memory is read first (see passOverFilters). A retry (PickRetry) that
// fits none fails with ErrNoEndpoints: it would only be refused again. A
// first pick goes ahead anyway: the request's tokens are an estimate, and
// the server's answer is the caller's.
//
// A limit on the prompt alone (Outcome.PromptWindow: TGI's
// max-input-tokens, TensorRT-LLM's maximum input length) is remembered
// apart, under the model's key salted (promptSalt), and weighed against
// the request's PromptTokens: remembered as a window for prompt and
// output, it passed the endpoint over for short prompts asking for long
// answers, which it takes.
//
// A pooling call (ServiceEmbedding, ServiceRerank) is weighed by its
// longest input instead (Request.LongestInput): a pooling server bounds
// each input by its window, not the call. vLLM checks each input of an
// embeddings batch, and each query and document pair of a rerank or score
// call, against max-model-len ("you requested 600 tokens in the input for
// embedding generation"); TEI each input or pair against its
// max-input-length; SGLang each request of a batch against its context
// length. The batch's total (Request.Tokens) says nothing of that: a batch
// of a hundred short texts fits a window of 512 that one long text does
// not. A pooling call whose LongestInput is 0 (not known) is checked
// against no window.
//
// A generation call of several sequences (n > 1 choices, or a batch of
// prompts: Request.LongestInput > 0 on a call that is not pooling) is
// weighed by its longest sequence, LongestInput + SequenceOutputTokens
// (and LongestInput against a limit on the prompt alone): vLLM checks each
// sequence, one prompt with max_tokens, against max-model-len, whatever n;
// SGLang and TGI alike. Its Tokens counts every sequence: a chat of a
// 2,000-token prompt with n = 4 and max_tokens = 1,000 is 6,000 tokens of
// load but sequences of 3,000, which a window of 4,096 takes.
//
// A call of no known service that names no model (TEI's /predict) is
// weighed as a pooling call: such a server limits each input. Its
// LongestInput is not known (0) unless the caller's Inspector gave it,
// so its first pick is checked against no window; a refusal's count of
// the input (TEI's "Given: 600") becomes its LongestInput, which its
// retry is weighed by, as an embedding call's.
//
// A call that names no model (Hugging Face TEI's native /embed, /rerank
// and /predict) goes to a server that takes calls without one and serves
// its one model: its window is remembered, and weighed, under the key of
// the empty name (modelKey(""), seeded like every model key and distinct
// from each named model's), so the windows of calls without a model and
// of a named model never stand for each other.
//
// Memory: per endpoint up to windowsPerEndpoint models (the oldest
// replaced), and per Balancer the smallest window of up to windowModels
// models, which gates the check: a request that fits every window
// remembered for its model (the usual case) costs a map lookup. A window
// that finds the gate full is still remembered by its endpoint, and while
// such a window lives a retry (PickRetry, a failover) reads the endpoints'
// own windows, so that it does not go back where it would be refused
// again; first picks go by the gate alone. Both are copied on write
// (refusals are rare) and read without locks. Model names are request
// data: they are kept as seeded hashes (modelKey).

// windowMemory is how long a window is remembered: windows change when a
// server is restarted with other flags, rarely, and a refusal costs the
// server no work.
const windowMemory = 10 * time.Minute

const (
	windowsPerEndpoint = 16
	windowModels       = 256
)

// window is a remembered context window of one model.
type window struct {
	model  uint64 // modelKey
	tokens int64
	until  int64 // unix ns
}

// live reports whether w is remembered at nowNs: it has not lapsed, and
// it lapses no further ahead than windowMemory (and stepTolerance) from
// nowNs. Further ahead, it was written before the clock stepped back, and
// would otherwise be remembered for the length of the step on top of
// windowMemory (for an hour's NTP step, an hour), steering calls away
// from a replica restarted with a larger window since; it is forgotten,
// as the core's deadlines set before a step end (see afterStepBack).
func (w window) live(nowNs int64) bool {
	return w.until > nowNs && w.until-nowNs <= int64(windowMemory+stepTolerance)
}

// promptSalt turns a model key into the key its limit on the prompt alone
// (Outcome.PromptWindow) is remembered under, apart from its window for
// the prompt and output.
const promptSalt = 0x6a09e667f3bcc909

// exceeds reports whether need does not fit w, a remembered window (0:
// none).
func exceeds(w, need int64) bool { return w > 0 && w < need }

// tooSmallFor reports whether e's remembered windows for model pass over
// a call of need tokens, of which needP are its prompt.
func (e *endpoint) tooSmallFor(model uint64, need, needP, nowNs int64) bool {
	return exceeds(e.windowOf(model, nowNs), need) || exceeds(e.windowOf(model^promptSalt, nowNs), needP)
}

// windowOf returns e's remembered window for model, or 0.
func (e *endpoint) windowOf(model uint64, nowNs int64) int64 {
	if ws := e.windows.Load(); ws != nil {
		for _, w := range *ws {
			if w.model == model && w.live(nowNs) {
				return w.tokens
			}
		}
	}
	return 0
}

// rememberWindow records that e refused a call for model ("": a call
// that named none) as longer than its window of tokens, or, with prompt,
// its prompt as longer than its limit on prompts of tokens.
func (b *Balancer) rememberWindow(e *endpoint, model string, tokens int, prompt bool, nowNs int64) {
	if tokens <= 0 {
		return
	}
	key, until := b.modelKey(model), nowNs+int64(windowMemory)
	if prompt {
		key ^= promptSalt
	}
	w := window{model: key, tokens: int64(tokens), until: until}
	for {
		old := e.windows.Load()
		var next []window
		if old != nil {
			next = slices.DeleteFunc(slices.Clone(*old), func(x window) bool { return x.model == key || !x.live(nowNs) })
		}
		if len(next) >= windowsPerEndpoint {
			next = next[1:] // the oldest
		}
		next = append(next, w)
		if e.windows.CompareAndSwap(old, &next) {
			break
		}
	}
	for {
		old := b.windows.Load()
		next := make(map[uint64]window, windowModels)
		if old != nil {
			for k, v := range *old {
				if v.live(nowNs) {
					next[k] = v
				}
			}
		}
		if cur, ok := next[key]; ok && cur.tokens < w.tokens {
			w.tokens = cur.tokens // the smallest window of the model, renewed
		}
		if _, ok := next[key]; !ok && len(next) >= windowModels {
			// Full: the endpoint's own entry still steers retries'
			// picks of it (windowFilter).
			for cur := b.windowsSpilled.Load(); cur < until && !b.windowsSpilled.CompareAndSwap(cur, until); cur = b.windowsSpilled.Load() {
			}
			return
		}
		next[key] = w
		if b.windows.CompareAndSwap(old, &next) {
			for cur := b.windowsUntil.Load(); cur < until && !b.windowsUntil.CompareAndSwap(cur, until); cur = b.windowsUntil.Load() {
			}
			return
		}
	}
}

// windowFilter sets c to pass over the members whose remembered window
// for req's model is below req's tokens, when some are and some are not.
// It reports whether every candidate is (then nothing is filtered). retry
// says the pick is a retry's or a failover's: it also reads the members'
// own windows while some found the gate full (windowsSpilled).
func (b *Balancer) windowFilter(req *inferlb.Request, g *group, c *cand, retry bool) (all bool) {
	ms := b.windows.Load()
	gated := ms != nil && b.windowsUntil.Load() > c.nowNs
	spilled := retry && b.windowsSpilled.Load() > c.nowNs
	if !gated && !spilled {
		return false // no window remembered now: no model key to hash
	}
	// A pooling call (a call of no known service that names no model,
	// TEI's /predict, too) by its longest input, a call of several
	// sequences by its longest: see above.
	need, needP := ctxwindow.Need(req)
	if need <= 0 {
		return false // no tokens known (need bounds needP): none to weigh
	}
	key := b.modelKey(req.Model)
	smallest := func(k uint64) int64 {
		if w, ok := (*ms)[k]; ok && w.live(c.nowNs) {
			return w.tokens
		}
		return 0
	}
	if !spilled && !exceeds(smallest(key), need) && !exceeds(smallest(key^promptSalt), needP) {
		return false // fits every window remembered for the model
	}
	some, other := false, false
	for _, e := range g.members {
		if !c.ok(e) {
			continue
		}
		if e.tooSmallFor(key, need, needP, c.nowNs) {
			some = true
		} else {
			other = true
		}
		if some && other {
			c.model = key
			c.windowNeed, c.promptNeed = int32(min(need, math.MaxInt32)), int32(min(needP, math.MaxInt32))
			return false
		}
	}
	return some
}

// tooSmall reports whether c passes e over as too small for the call.
func (c *cand) tooSmall(e *endpoint) bool {
	if c.windowNeed == 0 && c.promptNeed == 0 {
		return false
	}
	return e.tooSmallFor(c.model, int64(c.windowNeed), int64(c.promptNeed), c.nowNs)
}
