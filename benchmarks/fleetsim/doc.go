// Package fleetsim is a deterministic discrete-event simulator of a GPU
// inference fleet that compares routing policies, with inferlb's real
// balancer.Balancer among them, on the same seeded workload.
//
// # Why a simulator, and what keeps it honest
//
// Routing quality is a property of a fleet under load, not of one call; a
// simulator lets anyone rerun the comparison in seconds without GPUs. Three
// rules keep it from flattering inferlb:
//
//   - inferlb policies are the library's own Balancer (balancer.New, Update,
//     Pick, Pick.Done, Publish), fed a virtual Clock and a seeded PCG source;
//     nothing of it is re-implemented here. Variants with parts switched off
//     differ only in balancer.Options and in what the client feeds the
//     balancer (affinity keys, telemetry).
//   - Affinity keys come from request content through package cache, as a
//     real client computes them; the server's prefix cache is computed
//     independently from the same synthetic tokens.
//   - The oracle, an omniscient router that reads every replica's cache and
//     queue at the instant of each pick, shows what perfect information
//     buys. It is a greedy heuristic, not a proven optimum, and bounds
//     nothing: other policies beat it on single columns (consistent
//     hashing's cache hit rate on shared-prefix, inferlb's p99 TTFT on mix
//     and tokens/s on data-parallel), so "within X% of the oracle" is a
//     comparison with a strong router, not with the best possible one.
//
// # Server model (after vLLM V1)
//
// Each replica runs continuous batching: a FIFO waiting queue and a running
// batch of at most MaxNumSeqs sequences. Every engine step spends a token
// budget (MaxBatchedTokens) on the running sequences first, one token per
// decode and a chunk per unfinished prefill (chunked prefill), then admits
// waiting sequences while the batch, the budget and the KV cache allow. A
// step takes
//
//	speed x (StepFixed + PerPrefillToken x prefill tokens
//	         + PerDecodeSeq x decoding sequences + PerKVToken x context tokens read)
//
// so long prefills stall the decodes batched with them, as in vLLM.
//
// Replicas with the same ReplicaSpec.DPGroup are the data-parallel attention
// ranks of one engine (a MoE model served with DP attention by SGLang, vLLM
// or TensorRT-LLM): each has its own batch and KV cache, but every step is
// collective (the experts' all-to-all), so the ranks step together, a step
// lasts as long as the slowest rank's, and a rank with nothing to run waits
// in it. One rank's long prefill then stalls every rank's decodes. Discovery
// labels each rank DPLabel=dp<group>. inferlb and the oracle see every rank
// as an endpoint (Policy.SeesRanks); the baselines see one endpoint per
// engine, as a default vLLM data-parallel deployment shows it, and its
// front end picks the rank as vLLM's DPLBAsyncMPClient does: least
// waiting*4 + running, by counts the ranks report after their steps and
// the coordinator publishes every 100 ms. Least-request and consistent
// hashing also run shown every rank ("... +ranks"), as vLLM's
// external data-parallel mode (a server per rank) shows them to any
// balancer.
//
// The KV cache holds KVTokens/16 blocks of 16 tokens (vLLM's default block
// size). Full blocks are identified by chained hashes (parent hash + the
// block's tokens), registered when the step that computes them is
// scheduled (vLLM V1's allocate_slots caches them then, so a sequence
// admitted in the same step, after the running ones, hits a prefix another
// sequence of that step is still prefilling), kept after their sequence
// finishes and evicted least recently freed first; a new sequence reuses
// the longest cached chain of its prompt (automatic prefix caching,
// https://docs.vllm.ai/en/latest/design/prefix_caching.html). Answers are
// cached too, so the next turn of a conversation can hit the previous
// answer: it does when the client quotes the answer token for token, and
// not for the ChatRerender share of chat sessions whose client re-renders
// its history (Chat.Rerender), whose follow-ups hit only up to the end of
// the previous turn's prompt.
// When a running sequence needs a block and none is free, the most recently
// admitted sequence is preempted and recomputed later (vLLM V1's policy).
//
// A replica with ServerParams.MaxLoRAs = N runs LoRA adapters as vLLM
// with --enable-lora --max-loras N: a request is for an adapter when it
// names a model other than the base model (Model). A batch runs at most N
// distinct adapters; admitting a waiting request whose adapter is not
// among the running batch's while the batch already has N, the scheduler
// skips it (it keeps its place in the queue, and requests behind it may
// still be admitted: no head-of-line blocking), as vLLM V1's
// Scheduler.schedule does, until every running request of some adapter
// has finished. Base-model requests never wait for a slot. The GPU holds
// N adapters, least recently used out first (vLLM's
// LRUCacheWorkerLoRAManager); a step that runs an adapter not among them
// is longer by ServerParams.LoRALoad for each one it loads, for every
// sequence in it (LoRALoadDelay, 20 ms, says why). Every adapter is in
// the CPU cache (--max-cpu-loras), so none is read from disk.
// Result.LoRA reports the calls that waited for a slot, how long, and the
// loads per replica. MaxLoRAs 0, the default, is no limit, and the
// scenarios before lora-slots have it.
//
// LLMServer and EmbeddingServer document every parameter and its source; in
// short, one LLM replica is a 32B model on two H100s: ~20,000 prefill
// tokens/s and 300,000 KV tokens (llm-d's figures for its benchmark fleet,
// https://llm-d.ai/blog/kvcache-wins-you-can-see), 256 sequences and 8,192
// tokens per step (vLLM's defaults give an H100 8,192 tokens and 1,024
// sequences; in the LLM scenarios checked the KV cache fills first).
//
// # Clients, telemetry and incidents
//
// Each request is sent by one of Clients independent client processes
// (a hash of the seed and the call: a chat session's turns all come from
// one client, and every policy's run sends each call from the same
// client), each with its own Router and no shared state; the oracle alone
// is shared. Replicas publish Running, Waiting,
// KVCacheUsage and PrefixCacheHitRate every Scrape interval (phased per
// replica), as of the end of their last engine step (vLLM updates its
// gauges after each step), so the balancer sees telemetry as stale as a
// real scrape;
// those with MaxLoRAs also publish LoRASlots and Adapters (the base
// model, and the adapters of their running and of their waiting
// requests, sorted), as vLLM's vllm:lora_requests_info gauge shows them.
// Scenarios can script crashes (in-flight calls fail, the cache is lost,
// service discovery drops the replica after DiscoveryDelay), slow-downs,
// 429 load shedding and a model failing on a replica (below); a failed
// call is retried once when the router allows
// (inferlb retries as its adapters do, with Balancer.PickRetry: on another
// replica than the one that failed, within the retry budget).
// Replicas may serve only some models (ReplicaSpec.Models: the lora
// scenario loads each of 4 LoRA adapters on 2 of 8 replicas and tells
// discovery nothing of it; lora-many does the same with 32). A call for a model its replica lacks is answered within
// milliseconds, with no GPU work, as vLLM's 404 "The model `x` does not
// exist." is: inferlb reports it as Outcome.NotServedModel and sends the
// call on with PickRetry up to 8 times, as the HTTP transport does; the
// baselines take it for a failure and retry it once, as any failure.
// Result.NotServed counts those answers.
// A model can also fail on a replica that serves others (ModelFail: a
// Triton model whose backend crashed, a broken LoRA adapter): its calls
// in flight there fail, and later ones are answered 500 within
// milliseconds while the replica serves its other models. The
// model-failure scenario breaks one of three models on 2 of 8 replicas,
// model-failure-all on every replica (a bad version rolled out); the
// command runs both on seeds 1-4. Result.Healthy and Result.Broken split
// such a run's calls by model, and Result.Balancer sums what inferlb's
// balancers counted (trips, ejections, failures held against a model).
// Every call a replica answered (a success, a 500, a 429, a 404) reports
// its model in Outcome.Model, as the HTTP transport does, so the
// balancer can hold a model's failures against the model; a refused dial
// and a stream a crash cut do not. "inferlb no-outcome-model" names none,
// as the adapters did before 2026-12-05.
// The lora-slots scenario serves the base model and the same 12 adapters
// on every replica, with --max-loras 4 and Zipf popularity: not where an
// adapter lives but slot contention, which a router that spreads each
// adapter over every replica causes; "inferlb no-lora" is the Balancer
// with the scoring's LoRA factors off (NoLoRA). The command runs it on
// seeds 1-4.
// A replica may have a context window (ServerParams.MaxModelLen, vLLM
// --max-model-len; 0, the default, is none): a call whose prompt and
// max_tokens exceed it is refused with a 400 within a few milliseconds,
// before any GPU work, as vLLM does. inferlb reports the attempt as
// Outcome.ContextWindow (with Outcome.Model) and sends the call on with
// PickRetry within the 8 hops a not-served call has, as the HTTP
// transport does, and the caller gets the 400 when PickRetry finds no
// replica left; "inferlb no-window" reports it as a failure and retries
// once, and the baselines take it for a failure and retry once. The
// oracle knows the windows. Result.TooLong counts the refusals. The
// context-windows scenario gives 4 of 8 replicas an 8,192-token window
// and 4 a 32,768-token one, under a mix whose 15% long calls fit only
// the large; the command runs it on seeds 1-4.
// A replica's telemetry may never reach the clients (ReplicaSpec.Unscraped:
// its /metrics scrape fails, or it exports none), while the others are
// scraped as usual. The partial-telemetry scenario sends the chat workload
// through 8 independent clients to 8 replicas of which r7 is so; the
// clients see the others' server counts (every client's calls) and of r7
// only their own calls. Result.Share gives each replica's share of the
// calls, which the command prints for such a scenario. Before b1b8db7 the
// Balancer compared such a pair on those two counts: without affinity the
// clients sent r7 1.2-1.5 times its share, and at 40 req/s the p99 TTFT was
// 30.6s (0.89s just after b1b8db7, 0.94s in today's table); it now
// compares the pair on this client's calls alone.
// A replica's engine may hang (Hang) behind a live API server: it accepts
// calls and answers none (a stream gets its headers, no token), and its
// scrape keeps answering with the gauges frozen at the hang; a Crash and
// Restart end it. Scenario.ClientTimeout makes callers give up on a call
// that long after its arrival: the replica drops it, the router hears
// context.Canceled (inferlb.Outcome.Unanswered when no token came back;
// "inferlb no-unanswered" never sets it), and the call fails for good.
// Result.Abandoned counts those calls. The hung scenario hangs r0 of 8
// at 150 s under chat at 30 req/s and restarts it at 270 s.
// A replica may have the wrong API key (ReplicaSpec.Unauthorized): it
// answers every call 401 in a millisecond, with no GPU work, and the
// caller gets the 401 without a retry. inferlb reports it as
// inferlb.Outcome.ClientError, "inferlb client-error-as-success" as a
// success (the adapters before 2026-12-07), and the oracle sends it
// nothing. The unauthorized scenario runs the embedding workload on 6
// replicas of which r0 is so, unauthorized-chat the chat workload on 8
// (whose calls the affinity walk routes, and whose conversations end at
// a failed turn); Result.Unauthorized counts its 401s. A replica may
// also refuse some tenants' calls only (ReplicaSpec.RefusesTenants, a
// key not yet provisioned there), answering them as Unauthorized does;
// every outcome names its call's tenant (inferlb.Outcome.Tenant), as the
// adapters' do, and "inferlb no-tenant-memory" leaves it empty. The
// tenant-rollout scenario runs the chat workload from four tenants
// (Chat.Tenants) on 8 replicas of which r0 refuses tenant A's calls;
// Result.Tenants splits A's failed calls from the other tenants'
// attempts on r0.
// Requests may name a tenant (the tenants scenario floods the fleet from one
// tenant) and a class; Result.ClassE2EP99 reports each class's p99.
//
// # Measurement
//
// Requests that arrive in [Warmup, Duration) are measured. After Duration
// no new requests arrive and the run drains for at most Drain; calls still
// unfinished then are counted with their latency so far, so a policy cannot
// look good by leaving a backlog. A retried call's TTFT is that of the
// attempt that answers, which generates the answer anew. Throughput counts
// tokens produced inside the window, less those of attempts that failed (a
// crashed replica's streams and those a failing model's 500 ended, which
// the client discards when it retries). Failed calls are left out of the
// latency columns and counted in their own, and a chat turn that fails
// ends its conversation (its later turns are not sent): a policy that
// fails calls carries less load after them, which flatters it, not
// inferlb. The cache hit rate is prompt tokens
// found in the prefix cache over prompt tokens admitted, as vLLM's
// prefix_cache_hits / prefix_cache_queries: a preempted sequence that
// recomputes from its own blocks is not counted again (vLLM counts it
// apart). The inter-token latency distribution is over every token gap
// (a 1%-resolution log histogram), including stalls from prefill chunks and
// preemption. Everything runs on one goroutine in virtual time with seeded
// generators and ordered iteration, so the same seed gives the same Result.
package fleetsim
