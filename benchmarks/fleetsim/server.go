package fleetsim

import (
	"slices"
	"time"

	"github.com/inferlb/inferlb/telemetry"
)

// ServerParams model one replica of an inference engine run with continuous
// batching, after vLLM V1's scheduler. The zero value is not usable; start
// from LLMServer or EmbeddingServer.
type ServerParams struct {
	// KVTokens is the KV-cache capacity in tokens (rounded down to blocks).
	KVTokens int
	// MaxNumSeqs caps the running batch (vLLM --max-num-seqs).
	MaxNumSeqs int
	// MaxBatchedTokens is the per-step token budget shared by decodes and
	// chunked prefills (vLLM --max-num-batched-tokens).
	MaxBatchedTokens int
	// StepFixed is the cost of one forward pass regardless of batch: reading
	// the weights once, kernel launches, scheduling and sampling overhead.
	StepFixed time.Duration
	// PerPrefillToken is the compute cost of one prompt token.
	PerPrefillToken time.Duration
	// PerDecodeSeq is the extra cost of one decoding sequence in a step.
	PerDecodeSeq time.Duration
	// PerKVToken is the attention cost of one token of context read by a
	// scheduled sequence (memory bandwidth over its KV cache).
	PerKVToken time.Duration
	// AttnNsPerPair, when positive, is the compute of attention in a
	// prefill, in nanoseconds per (prompt token, context token) pair: a
	// chunk of n tokens after c computed ones costs n*c + n(n+1)/2 pairs.
	// PerKVToken charges the context's read once per step; this charges
	// the FLOPs that grow with prompt length squared. 0 (every scenario's
	// fleet) leaves prefill linear (TestSharedPrefixAttentionWhatIf sizes
	// what that leaves out).
	AttnNsPerPair float64
	// PrefixCaching enables automatic prefix caching (vLLM's default in V1).
	PrefixCaching bool
	// MaxWaiting, when positive, makes the replica answer 429 (too many
	// requests) instead of queueing beyond this many waiting requests, as a
	// server with an admission limit does.
	MaxWaiting int
	// RetryAfter is the hint sent with a 429.
	RetryAfter time.Duration
	// MaxLoRAs, when positive, is how many distinct LoRA adapters one
	// batch may run, and how many adapter slots the GPUs hold (vLLM
	// --enable-lora --max-loras N; vLLM's default N is 1). A request is
	// for an adapter when it names a model other than the base model
	// (Model; an empty name is the base model too). 0 is no limit and no
	// adapter telemetry, as every scenario before lora-slots has.
	MaxLoRAs int
	// LoRALoad is how much longer a step is for each adapter it loads
	// into a GPU slot (the adapter was not among the MaxLoRAs most
	// recently used). See LoRALoadDelay.
	LoRALoad time.Duration
	// MaxModelLen, when positive, is the replica's context window (vLLM
	// --max-model-len): a call whose prompt and max output tokens
	// (max_tokens) together exceed it is refused with a 400 before any
	// work (vLLM's "This model's maximum context length is N tokens.
	// However, you requested ..."), within windowRefusalDelay. 0 is no
	// limit, as every scenario before context-windows has.
	MaxModelLen int
}

// LoRALoadDelay is the LoRALoad the lora-slots scenario uses: copying one
// adapter from vLLM's CPU cache (--max-cpu-loras, which holds every
// adapter of the scenario) into a GPU slot. A rank-16 adapter on every
// projection of a Qwen3-32B-class model is 16 x 131,072 x 64 layers =
// 134M parameters, 268 MB in BF16, 134 MB per GPU at tensor parallel 2:
// 5-10 ms over PCIe Gen5 at a realistic 15-25 GB/s, plus vLLM's Python
// loop that sets the weights of some 450 LoRA-wrapped modules one by one
// (a few ms more). The step that admits the request pays it, and so every
// sequence batched with it, as vLLM activates adapters before the
// forward pass. A load from disk (an adapter not in the CPU cache) costs
// tens to hundreds of ms more; the scenario has none.
const LoRALoadDelay = 20 * time.Millisecond

// LLMServer returns the parameters of one replica serving a 32B dense model
// (Qwen3-32B class) on H100s with vLLM, as in llm-d's prefix-cache benchmark
// (https://llm-d.ai/blog/kvcache-wins-you-can-see: 8 vLLM pods on 16 H100,
// i.e. tensor parallel 2 per pod):
//
//   - PerPrefillToken 50µs: about 20,000 prefill tokens/s per replica, the
//     figure llm-d publishes for this setup. It agrees with arithmetic: 32B
//     parameters need 64 GFLOP per token, and two H100s at ~50% of their
//     989 dense BF16 TFLOPS give ~15-20k tokens/s.
//   - KVTokens 300,000: llm-d's per-pod KV capacity for that model. (Qwen3-32B
//     stores 64 layers x 8 KV heads x 128 dims x 2 (K and V) x 2 bytes =
//     256 KiB per token; ~75 GiB of KV across two 80 GB GPUs.)
//   - StepFixed 12ms: reading 64 GB of BF16 weights once per step at two
//     GPUs' 3.35 TB/s takes ~10ms, plus scheduling and sampling overhead.
//   - PerDecodeSeq 50µs: a decoded token costs the FLOPs of a prefilled one.
//   - PerKVToken 40ns: reading 256 KiB of KV per token of context at 6.7 TB/s.
//   - MaxBatchedTokens 8192: vLLM's default token budget for an
//     OpenAI-compatible server on a GPU of 70 GiB or more other than an
//     A100 (EngineArgs.get_batch_defaults in vllm/engine/arg_utils.py).
//   - MaxNumSeqs 256: vLLM's default on smaller GPUs and A100s; on an H100
//     the same defaults give 1024. The KV cache bounds the scenarios'
//     batches before either does (quick runs of shared-prefix, chat, mix,
//     hot-prompt and tenants with round-robin and inferlb peaked at 121
//     running sequences, 2026-12-06).
//
// The resulting ITL is 20-40 ms at the batch sizes the scenarios reach, and
// the TTFT of a cold 10,000-token prompt on an idle replica is ~0.6 s (llm-d
// reports 4.3 s cold on a single TP1 instance and 0.6 s warm; with TP2 and
// chunked prefill our cold figure sits between).
func LLMServer() ServerParams {
	return ServerParams{
		KVTokens:         300_000,
		MaxNumSeqs:       256,
		MaxBatchedTokens: 8192,
		StepFixed:        12 * time.Millisecond,
		PerPrefillToken:  50 * time.Microsecond,
		PerDecodeSeq:     50 * time.Microsecond,
		PerKVToken:       40 * time.Nanosecond,
		PrefixCaching:    true,
	}
}

// EmbeddingServer returns the parameters of one replica serving an embedding
// or cross-encoder reranker model (BGE-large / bge-reranker class, ~335M
// parameters) with a batching server such as vLLM's pooling runner or
// Hugging Face TEI: prefill only, no decode. 335M parameters need 0.7 GFLOP
// per token; at a conservative ~30% of an L4's 121 TFLOPS FP16 that is about
// 60,000 tokens/s (PerPrefillToken 16µs), and a forward pass has a few
// milliseconds of fixed overhead (tokenization, padding, launch). The batch
// is capped at 32 sequences and 16,384 tokens, TEI's default
// --max-batch-tokens (https://huggingface.co/docs/text-embeddings-inference/cli_arguments).
func EmbeddingServer() ServerParams {
	return ServerParams{
		KVTokens:         1 << 20, // no KV pressure: pooling models keep nothing
		MaxNumSeqs:       32,
		MaxBatchedTokens: 16384,
		StepFixed:        3 * time.Millisecond,
		PerPrefillToken:  16 * time.Microsecond,
		PerDecodeSeq:     0,
		PerKVToken:       0,
		PrefixCaching:    false,
	}
}

// seq is one request inside a replica.
type seq struct {
	job       *job
	prompt    *Prompt
	hashes    []uint64 // prompt hashes, then hashes of answer blocks as they fill
	computed  int      // tokens whose KV is computed
	generated int      // output tokens produced (survive preemption)
	blocks    []int32
	sched     int // tokens scheduled in the current step; 0 = not scheduled
	hitTokens int // prefix-cache hit expected at enqueue, then found at admission
	prefilled bool
	preempted bool // recomputing after a preemption
	// slotHeld: the scheduler skipped the sequence for want of an adapter
	// slot at slotSince, and has not found it one since (MaxLoRAs).
	slotHeld  bool
	slotSince time.Duration
	lastToken time.Duration
	// windowTokens is what this attempt added to the window's throughput;
	// if the attempt fails, the client throws it away (see crash).
	windowTokens int64
}

func (s *seq) numTokens() int { return s.prompt.Tokens + s.generated }

// replica is one simulated server.
//
// It is driven by the simulator's single goroutine: enqueue from arrivals,
// stepDone from the event it scheduled.
type replica struct {
	idx   int
	id    string
	p     ServerParams
	speed float64 // step-time multiplier: 3 means three times slower
	base  float64 // speed when healthy
	kv    *blockPool
	sim   *run

	models []string // served (ReplicaSpec.Models); nil: all
	// unauthorized: it answers every call 401 (ReplicaSpec.Unauthorized).
	unauthorized bool
	// refuses: it answers 401 the calls of these tenants only
	// (ReplicaSpec.RefusesTenants).
	refuses []string
	failing []string // served models that fail every call (ModelFail)
	// resident are the adapters in the GPU's MaxLoRAs slots, least
	// recently used first.
	resident []string

	up       bool
	hung     bool // its engine steps no more (Hang)
	throttle bool // answer 429 beyond MaxWaiting
	gen      uint64
	waiting  []*seq // FIFO; preempted sequences go back to the front
	running  []*seq // admission order; the last is preempted first
	stepping bool
	dp       *dpEngine // the engine whose steps this rank shares; nil when independent
	// fresh are the blocks the step under way registered in the prefix
	// cache (cacheScheduled): if the step is dropped (dpEngine.abort),
	// their KV was never computed and they leave the cache.
	fresh []int32

	// counters
	busy          time.Duration
	hitTokens     int64
	queryTokens   int64
	scrapeHits    int64 // since the last gauge update, for the windowed hit rate
	scrapeQueries int64
	// gauges are what a scrape reads: the metrics as of the end of the
	// last completed engine step (see snapshot).
	gauges      gauges
	assigned    int
	preemptions int
	loads       int // adapters loaded into a GPU slot
}

// gauges are a replica's metrics as a /metrics scrape reads them.
type gauges struct {
	running, waiting int
	kvUsage          float64
	// hits and queries are the prompt tokens found in and looked up in
	// the prefix cache since the last scrape, as of the last update.
	hits, queries int64
	adapters      *telemetry.Adapters // MaxLoRAs only
}

// snapshot updates the gauges a scrape reads to the replica's state now,
// at the end of an engine step: vLLM's engine core makes its scheduler's
// stats (running and waiting requests, KV-cache usage, prefix-cache
// queries and hits, the adapters of lora_requests_info) with each step's
// outputs, so the gauges lag the queue by up to one step; a call that
// arrives at an idle replica shows once its first step ends.
func (r *replica) snapshot() {
	g := &r.gauges
	g.running, g.waiting, g.kvUsage = len(r.running), len(r.waiting), r.kv.usage()
	g.hits += r.scrapeHits
	g.queries += r.scrapeQueries
	r.scrapeHits, r.scrapeQueries = 0, 0
	if r.p.MaxLoRAs > 0 {
		g.adapters = r.adapters()
	}
}

func newReplica(idx int, id string, p ServerParams, speed float64, s *run) *replica {
	return &replica{
		idx: idx, id: id, p: p, speed: speed, base: speed, sim: s, up: true,
		kv: newBlockPool(p.KVTokens / BlockSize),
	}
}

// serves reports whether the replica serves model.
func (r *replica) serves(model string) bool {
	return r.models == nil || slices.Contains(r.models, model)
}

// refusesTenant reports whether the replica answers req 401 for its
// tenant (ReplicaSpec.RefusesTenants).
func (r *replica) refusesTenant(req *Request) bool {
	return req.Tenant != "" && slices.Contains(r.refuses, req.Tenant)
}

// tooLong reports whether the replica refuses req as longer than its
// context window (ServerParams.MaxModelLen): vLLM's input processor
// refuses a prompt whose tokens and max_tokens together exceed
// max_model_len.
func (r *replica) tooLong(req *Request) bool {
	return r.p.MaxModelLen > 0 && req.Prompt.Tokens+req.MaxOutputTokens > r.p.MaxModelLen
}

// failsModel reports whether the replica fails every call for model.
func (r *replica) failsModel(model string) bool {
	return len(r.failing) > 0 && slices.Contains(r.failing, model)
}

// failModel makes model fail on the replica: its calls in flight end with
// a 500 (an error event in their streams) and later ones are answered 500
// at once (see send), while the replica serves its other models.
func (r *replica) failModel(model string) {
	if r.failsModel(model) {
		return
	}
	r.failing = append(r.failing, model)
	var fail []*seq
	keep := func(q []*seq) []*seq {
		out := q[:0]
		for _, s := range q {
			if s.job.req.Model == model {
				fail = append(fail, s)
				continue
			}
			out = append(out, s)
		}
		clear(q[len(out):])
		return out
	}
	// A sequence in the step under way leaves the batch now; the step
	// keeps the duration it was planned with.
	r.running, r.waiting = keep(r.running), keep(r.waiting)
	now := r.sim.now
	for _, s := range fail {
		r.kv.release(s.blocks)
		s.blocks = nil
		// The client throws away what the stream carried, as after a crash.
		r.sim.wasteTokens(s.job, s.windowTokens)
		r.sim.finish(s.job, now, errModelFailed)
	}
	r.kick()
}

// recoverModel ends model's failure on the replica.
func (r *replica) recoverModel(model string) {
	r.failing = slices.DeleteFunc(r.failing, func(m string) bool { return m == model })
}

// enqueue accepts a job. It returns false when the replica rejects it with 429.
func (r *replica) enqueue(j *job) bool {
	if r.throttle && r.p.MaxWaiting > 0 && len(r.waiting) >= r.p.MaxWaiting {
		return false
	}
	s := &seq{job: j, prompt: j.req.Prompt}
	s.hashes = s.prompt.Hashes[:len(s.prompt.Hashes):len(s.prompt.Hashes)] // appends copy
	s.hitTokens = r.expectedHit(s)
	r.waiting = append(r.waiting, s)
	j.sq = s
	r.assigned++
	r.kick()
	return true
}

// expectedHit is the cache hit a sequence would get if admitted now.
func (r *replica) expectedHit(s *seq) int {
	if !r.p.PrefixCaching {
		return 0
	}
	maxBlocks := (s.numTokens() - 1) / BlockSize
	h := s.hashes[:min(len(s.hashes), maxBlocks)]
	return r.kv.contains(h) * BlockSize
}

func (r *replica) kick() {
	if r.dp != nil {
		r.dp.kick()
		return
	}
	if !r.stepping && r.up && !r.hung && (len(r.running) > 0 || len(r.waiting) > 0) {
		r.step()
	}
}

// preempt frees a running sequence's blocks and puts it back at the front of
// the queue; it will recompute its prompt and answer so far (vLLM V1's
// recompute preemption), usually with a prefix-cache hit on its own blocks.
func (r *replica) preempt(s *seq) {
	r.kv.release(s.blocks)
	s.blocks = s.blocks[:0]
	s.computed = 0
	s.sched = 0
	s.prefilled = false
	s.preempted = true
	r.waiting = append([]*seq{s}, r.waiting...)
	r.preemptions++
}

// ensure allocates blocks so s can hold upto tokens.
func (r *replica) ensure(s *seq, upto int) bool {
	need := (upto+BlockSize-1)/BlockSize - len(s.blocks)
	if need <= 0 {
		return true
	}
	var ok bool
	s.blocks, ok = r.kv.alloc(need, s.blocks)
	return ok
}

// step schedules one engine iteration, after vLLM V1's Scheduler.schedule:
// running sequences first (decodes and unfinished chunked prefills), then
// waiting ones while the batch, the token budget and the KV cache allow.
// When the cache cannot hold the next token of a running sequence, the most
// recently admitted sequence is preempted.
func (r *replica) step() {
	d, ok := r.plan()
	if !ok {
		// Nothing to run: the engine goes idle, its gauges as they are.
		r.snapshot()
		return
	}
	r.stepping = true
	r.busy += d
	gen := r.gen
	r.sim.after(d, func() { r.stepDone(gen) })
}

// plan forms the next batch (see step) and returns how long its forward pass
// takes on this replica; false when nothing is running.
func (r *replica) plan() (time.Duration, bool) {
	r.fresh = r.fresh[:0]
	budget := r.p.MaxBatchedTokens
	preempted := false
	var prefillTok, decodes, kvTok int
	var pairs float64 // attention pairs of the step's prefill chunks (AttnNsPerPair)
	for i := 0; i < len(r.running) && budget > 0; i++ {
		s := r.running[i]
		n := min(s.numTokens()-s.computed, budget)
		for !r.ensure(s, s.computed+n) {
			victim := r.running[len(r.running)-1]
			r.running = r.running[:len(r.running)-1]
			r.preempt(victim)
			preempted = true
			if victim == s {
				n = 0
				break
			}
		}
		if n == 0 {
			break // s itself was preempted: it was the last one
		}
		s.sched = n
		budget -= n
		r.cacheScheduled(s)
		if s.prefilled {
			decodes++
		} else {
			prefillTok += n
			pairs += attnPairs(s.computed, n)
		}
		kvTok += s.computed + n
	}
	// The adapters of the running batch, when their number is limited;
	// sequences the limit holds are set aside and go back to the front of
	// the queue, in order, after admission.
	var batch []string
	var skipped []*seq
	if r.p.MaxLoRAs > 0 {
		batch = r.batchAdapters()
	}
	for !preempted && len(r.waiting) > 0 && len(r.running) < r.p.MaxNumSeqs && budget > 0 {
		s := r.waiting[0]
		if r.p.MaxLoRAs > 0 {
			a := adapterOf(s)
			if a != "" && len(batch) >= r.p.MaxLoRAs && !slices.Contains(batch, a) {
				// vLLM V1's Scheduler.schedule: "Scheduling would exceed
				// max_loras, skip." The request keeps its place, and the
				// ones behind it may still be admitted.
				r.waiting = r.waiting[1:]
				skipped = append(skipped, s)
				if !s.slotHeld {
					s.slotHeld, s.slotSince = true, r.sim.now
				}
				continue
			}
			r.sim.slotFound(s)
		}
		hit := 0
		if r.p.PrefixCaching && s.computed == 0 {
			maxBlocks := (s.numTokens() - 1) / BlockSize // at least one token must be computed
			h := s.hashes[:min(len(s.hashes), maxBlocks)]
			var idle int
			hit, idle = r.kv.lookup(h)
			n := min(s.numTokens()-hit*BlockSize, budget)
			need := (hit*BlockSize+n+BlockSize-1)/BlockSize - hit
			if need > r.kv.nFree-idle {
				break // wait for blocks to free up
			}
			s.blocks = r.kv.touch(h, hit, s.blocks)
			s.computed = hit * BlockSize
		}
		n := min(s.numTokens()-s.computed, budget)
		if !r.ensure(s, s.computed+n) {
			r.kv.release(s.blocks)
			s.blocks = s.blocks[:0]
			s.computed = 0
			break
		}
		r.waiting = r.waiting[1:]
		r.running = append(r.running, s)
		hitTok := hit * BlockSize
		s.hitTokens = hitTok
		if !s.preempted {
			// A preempted sequence finds its own blocks again: vLLM counts
			// that recompute apart from the prefix-cache hit rate
			// (PrefixCacheStats.preempted_*), and so does this.
			r.hitTokens += int64(hitTok)
			r.queryTokens += int64(s.numTokens())
			r.scrapeHits += int64(hitTok)
			r.scrapeQueries += int64(s.numTokens())
		}
		s.sched = n
		budget -= n
		r.cacheScheduled(s)
		prefillTok += n
		pairs += attnPairs(s.computed, n)
		kvTok += s.computed + n
		if a := adapterOf(s); r.p.MaxLoRAs > 0 && a != "" && !slices.Contains(batch, a) {
			batch = append(batch, a)
		}
	}
	if len(skipped) > 0 {
		r.waiting = append(skipped, r.waiting...)
	}
	if len(r.running) == 0 {
		return 0, false
	}
	d := r.p.StepFixed +
		time.Duration(prefillTok)*r.p.PerPrefillToken +
		time.Duration(decodes)*r.p.PerDecodeSeq +
		time.Duration(kvTok)*r.p.PerKVToken +
		time.Duration(pairs*r.p.AttnNsPerPair)
	if r.p.MaxLoRAs > 0 {
		d += time.Duration(r.activate(batch)) * r.p.LoRALoad
	}
	return time.Duration(float64(d) * r.speed), true
}

// adapterOf is the LoRA adapter s runs with, "" for the base model.
func adapterOf(s *seq) string {
	if m := s.job.req.Model; m != Model {
		return m
	}
	return ""
}

// batchAdapters returns the distinct adapters of the running batch, in
// admission order.
func (r *replica) batchAdapters() []string {
	var out []string
	for _, s := range r.running {
		if a := adapterOf(s); a != "" && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// activate puts the batch's adapters (at most MaxLoRAs) in GPU slots, as
// vLLM's LRUCacheWorkerLoRAManager does before each forward pass: those
// resident become the most recently used, and each other one is loaded
// into a free slot or in place of the least recently used adapter that
// the batch does not run. It returns how many it loaded.
func (r *replica) activate(batch []string) int {
	loads := 0
	for _, a := range batch {
		if i := slices.Index(r.resident, a); i >= 0 {
			r.resident = append(slices.Delete(r.resident, i, i+1), a)
		}
	}
	for _, a := range batch {
		if slices.Contains(r.resident, a) {
			continue
		}
		if len(r.resident) >= r.p.MaxLoRAs {
			// The front is least recently used, and not in the batch: the
			// batch's resident adapters were moved to the back, and the
			// batch has no more adapters than there are slots.
			r.resident = slices.Delete(r.resident, 0, 1)
		}
		r.resident = append(r.resident, a)
		loads++
	}
	r.loads += loads
	return loads
}

// adapters is the replica's vllm:lora_requests_info: the distinct
// adapters of its running and waiting requests, sorted, built anew for
// each gauge update (snapshot) since a published Adapters is never
// changed.
func (r *replica) adapters() *telemetry.Adapters {
	names := func(q []*seq) []string {
		var out []string
		for _, s := range q {
			if a := adapterOf(s); a != "" && !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
		slices.Sort(out)
		if len(out) > telemetry.MaxAdapterNames {
			out = out[:telemetry.MaxAdapterNames] // what a source keeps
		}
		return out
	}
	return &telemetry.Adapters{Base: Model, Running: names(r.running), Waiting: names(r.waiting)}
}

// stepDone applies one finished iteration: computed KV advances (the full
// blocks entered the prefix cache when the step was planned, see
// cacheScheduled), sequences whose input is all computed emit a token,
// finished ones leave and free their blocks.
func (r *replica) stepDone(gen uint64) {
	if gen != r.gen { // the replica crashed during the step
		return
	}
	r.stepping = false
	r.apply()
	r.snapshot()
	r.kick()
}

// apply applies the finished step to the running batch.
func (r *replica) apply() {
	now := r.sim.now
	keep := r.running[:0]
	for _, s := range r.running {
		n := s.sched
		if n == 0 {
			keep = append(keep, s)
			continue
		}
		s.sched = 0
		s.computed += n
		if s.computed < s.numTokens() {
			keep = append(keep, s) // more prefill chunks to go
			continue
		}
		s.prefilled = true
		s.generated++
		j := s.job
		if s.generated == 1 && j.firstToken < 0 {
			j.firstToken = now
		} else if s.generated > 1 && r.sim.inWindow() {
			r.sim.itl.add(now - s.lastToken)
		}
		s.lastToken = now
		if j.onToken != nil {
			j.onToken(s.generated)
		}
		tok := int64(1)
		if j.req.OutputTokens == 0 {
			tok = int64(s.prompt.Tokens) // pooling: the work is the input
		}
		r.sim.tokens += tok
		if r.sim.inWindow() {
			s.windowTokens += tok
			r.sim.countTokens(j, tok)
		}
		if s.generated >= max(j.req.OutputTokens, 1) {
			r.kv.release(s.blocks)
			s.blocks = nil
			r.sim.finish(j, now, nil)
			continue
		}
		keep = append(keep, s)
	}
	clear(r.running[len(keep):])
	r.running = keep
}

// cacheScheduled registers in the prefix cache the full blocks of the
// tokens s is scheduled to compute in this step (s.computed+s.sched), when
// the step is planned rather than when it ends, as vLLM V1 does:
// KVCacheManager.allocate_slots calls cache_blocks right after allocating
// the step's slots, so a request the scheduler admits later in the same
// step (the waiting queue comes after the running batch) finds them
// through get_computed_blocks: a follow-up that arrives while its prefix
// is being prefilled hits the blocks of the chunk scheduled with it, not
// only those of chunks already done. That is sound for attention: every layer writes the
// step's new keys and values into the paged cache before its attention
// kernel reads the cache, so a sequence of the same step reads them
// computed. (vLLM refuses such same-step hits only for Mamba layers, whose
// state is not computed until the step ends; the simulated model has none.)
// A block another block already holds stays out, as in register.
func (r *replica) cacheScheduled(s *seq) {
	if !r.p.PrefixCaching {
		return
	}
	for k := s.computed / BlockSize; k < (s.computed+s.sched)/BlockSize; k++ {
		if k >= len(s.hashes) {
			s.hashes = append(s.hashes, r.answerBlockHash(s, k))
		}
		if r.kv.register(s.blocks[k], s.hashes[k]) {
			r.fresh = append(r.fresh, s.blocks[k])
		}
	}
}

// answerBlockHash hashes full block k of the prompt-plus-answer stream; it is
// called only for blocks beyond the prompt's full blocks.
func (r *replica) answerBlockHash(s *seq, k int) uint64 {
	var h blockHasher
	if k > 0 {
		h.parent = s.hashes[k-1]
	}
	var toks [BlockSize]uint64
	s.prompt.tokensAt(k*BlockSize, s.job.req.AnswerID, toks[:])
	var out uint64
	for _, tok := range toks {
		out, _ = h.add(tok)
	}
	return out
}

func (r *replica) baseSpeed() float64 { return r.base }

// hang stops the engine (Hang): the step under way never ends, no other
// starts, and the gauges stay as the last step left them.
func (r *replica) hang() {
	r.hung = true
	r.gen++
	r.stepping = false
}

// drop removes s from the replica, as the engine aborts a call whose
// client went away, and reports whether it was there.
func (r *replica) drop(s *seq) bool {
	if i := slices.Index(r.waiting, s); i >= 0 {
		r.waiting = slices.Delete(r.waiting, i, i+1)
	} else if i := slices.Index(r.running, s); i >= 0 {
		r.running = slices.Delete(r.running, i, i+1)
	} else {
		return false
	}
	r.kv.release(s.blocks)
	s.blocks = nil
	return true
}

// crash fails everything on the replica and drops its cache.
func (r *replica) crash() {
	r.up = false
	r.hung = false
	r.gen++
	r.stepping = false
	if r.dp != nil {
		r.dp.abort()
	}
	now := r.sim.now
	fail := append(append([]*seq(nil), r.running...), r.waiting...)
	r.running, r.waiting = nil, nil
	r.kv.flush()
	r.resident = nil // the restarted engine loads its adapters anew
	r.gauges = gauges{}
	r.scrapeHits, r.scrapeQueries = 0, 0
	for _, s := range fail {
		// The tokens it streamed are lost with the call: a retry
		// generates the answer anew, and throughput counts answers.
		r.sim.wasteTokens(s.job, s.windowTokens)
		r.sim.finish(s.job, now, errCrashed)
	}
	if r.dp != nil {
		// The other ranks' step was dropped with this one's; without a
		// kick they would wait for the next arrival.
		r.dp.kick()
	}
}

// restart brings a crashed replica back, cold.
func (r *replica) restart() {
	r.up = true
	r.kick()
}

// pendingPrefill is the prompt work queued or in progress on the replica, in
// tokens after prefix-cache hits: the oracle's view of its queue.
func (r *replica) pendingPrefill() int {
	n := 0
	for _, s := range r.waiting {
		n += s.numTokens() - s.hitTokens
	}
	for _, s := range r.running {
		if !s.prefilled {
			n += s.numTokens() - s.computed
		}
	}
	return n
}

// dpEngine couples the data-parallel attention ranks of one engine (SGLang's
// DP attention, vLLM's data parallel deployment of a MoE model, TensorRT-LLM's
// attention DP): each rank has its own batch and KV cache, but every forward
// pass is collective (the experts' all-to-all), so all ranks step together
// and a step lasts as long as the slowest rank's. A rank with nothing to run
// still joins each step (a dummy batch), and its GPU is held for it. Load
// one rank more than the others and the whole engine slows down.
type dpEngine struct {
	ranks    []*replica
	stepping bool
	gen      uint64
	// front picks the rank of the calls a policy without SeesRanks
	// sends to the engine; nil when every policy of the run sees ranks.
	front *dpFront
}

func (e *dpEngine) kick() {
	if e.stepping {
		return
	}
	var d time.Duration
	active := false
	for _, r := range e.ranks {
		if !r.up {
			continue
		}
		if rd, ok := r.plan(); ok {
			d, active = max(d, rd), true
			r.stepping = true
		}
	}
	if !active {
		for _, r := range e.ranks {
			if r.up {
				r.snapshot()
			}
		}
		return
	}
	for _, r := range e.ranks {
		if r.up {
			r.busy += d
		}
	}
	e.stepping = true
	gen := e.gen
	e.ranks[0].sim.after(d, func() { e.done(gen) })
}

func (e *dpEngine) done(gen uint64) {
	if gen != e.gen {
		return
	}
	e.stepping = false
	for _, r := range e.ranks {
		if r.stepping {
			r.stepping = false
			r.apply()
		}
		if r.up {
			r.snapshot() // every rank's engine core reports each step
		}
	}
	e.kick()
}

// abort drops the step in progress (a rank crashed): the others' batches
// are scheduled again at the next kick, and the blocks the step registered
// in their prefix caches leave them.
func (e *dpEngine) abort() {
	e.gen++
	e.stepping = false
	for _, r := range e.ranks {
		r.stepping = false
		for _, s := range r.running {
			s.sched = 0
		}
		// The blocks the dropped step registered were never computed.
		// Those of sequences still running are registered again when
		// they are scheduled again; those of sequences that left the
		// batch during the step (failModel) must not be found by others.
		for _, b := range r.fresh {
			r.kv.unregister(b)
		}
		r.fresh = r.fresh[:0]
	}
}

// attnPairs is the attention pairs of a prefill chunk of n tokens after c
// computed ones: each new token attends to all before it and itself.
func attnPairs(c, n int) float64 { return float64(n)*float64(c) + float64(n)*float64(n+1)/2 }
