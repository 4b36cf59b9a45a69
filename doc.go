// Package inferlb is an embeddable client-side load balancer for AI inference
// traffic: every process that imports it routes its own calls to a fleet of
// LLM, embedding and reranker servers (vLLM, SGLang, TensorRT-LLM, Triton,
// TGI, TEI, llama.cpp), with no proxy in the path.
//
// This root package holds the vocabulary every other package shares:
// Endpoint, Request, Service, Outcome, and NewContext / FromContext for
// transports that see only a context.
//
// # Packages and dependency direction
//
// Each package imports only packages above it in this list; no core package
// (the first five) imports gRPC or net/http, which a test enforces.
//
//	inferlb (root)          vocabulary; standard library only
//	telemetry               Sample, Sink, Store (latest value of each field, with its age)
//	cache                   seeded affinity keys, consistent placement, sessions; xxhash only
//	scoring                 Scorer and per-service scorers: pure cost functions
//	balancer                the picker (P2C, a full scan for local prices): durable endpoint state, immutable snapshots
//	telemetry/loadheader    vLLM's per-response load header; standard library and telemetry only
//	balancer/grpcbalancer   gRPC load-balancing policy "inferlb"
//	balancer/httpbalancer   http.RoundTripper for OpenAI-compatible APIs
//	telemetry/dcgm, telemetry/modelserver, telemetry/promapi   telemetry sources
//	metrics                 Prometheus collectors over a Balancer, a telemetry Store, a Poller and an HTTP Transport
//	benchmarks, examples    fleet simulator and runnable programs
//
// # The life of one request
//
// A call goes through these steps; the sections after this one say more
// of each.
//
//  1. An adapter (the HTTP transport, the gRPC policy) turns the call into
//     a Request: its service, model, token estimates, affinity key and
//     tenant.
//  2. It asks the Balancer to Pick, or, on a Balancer shared by several
//     adapters, its own balancer.Membership, which holds that adapter's
//     endpoint set and readiness over the one shared state per endpoint ID.
//  3. Pick loads the current immutable snapshot and chooses the group that
//     serves the model (endpoints name their models in inferlb.Endpoint's
//     labels: given to the HTTP transport with each Addr, to the gRPC
//     policy by the service config's "endpoints" for the stock DNS and
//     passthrough resolvers, or by grpcbalancer.WithEndpoint in a resolver
//     of one's own) and, for a request that names a tenant when
//     Options.TenantShardSize is set, the tenant's shard of it.
//  4. A request with an affinity key goes to the key's owner while the
//     owner is within its bounded load, else to the next endpoints in the
//     key's order (see Affinity below).
//  5. Otherwise Pick prices two candidates, or every one for some
//     services, and the cheaper wins (see Pricing the candidates).
//  6. Pick counts the call in flight and returns a Pick handle. Pick never
//     blocks, locks or allocates.
//  7. The adapter sends the call and reads what it was from the call (see
//     Reading the answer). When the response or stream has ended, it
//     reports an Outcome through Done exactly once.
//  8. Done releases the load, feeds the latency, TTFT, decode-speed and
//     error EWMAs and the circuit breaker; an overload answer cools the
//     endpoint down for its Retry-After, and one that refuses again a call
//     sent at that time is second choice to its peers for a while after
//     (its probation, doubling while the refusals go on, see
//     balancer.Options.DefaultCooldown), so a client's retry at
//     Retry-After goes to a peer. Some answers are neither success
//     nor failure and teach the Balancer something else (see Answers that
//     are neither success nor failure).
//
// # Building the request
//
// An adapter takes the service from the path or method, and the model,
// token estimates, affinity key and tenant from the call. The HTTP
// transport estimates tokens from the body; the gRPC policy from the
// request message when grpcbalancer.UnaryEstimate or StreamEstimate is
// installed, since grpc-go's picker sees no message.
//
// With Options.TenantShardSize, a request that names a tenant is confined
// to that tenant's shard of the group (shuffle sharding: k endpoints, each
// the first on the ring from one of the tenant's seeded keys that the shard
// does not hold yet), and everything below happens inside the shard. A
// shard that is down sends the request to the whole group, or with
// TenantShardStrict fails it.
//
// # Affinity
//
// A request with an affinity key (a seeded hash of its prompt prefix or
// session, from Balancer.Keyer) goes to the key's owner on a
// consistent-hash ring while the owner is within its bounded load. Past the
// bound, the next endpoints in the key's own order take it, so independent
// callers agree without talking. The bound:
//
//   - is counted in all callers' calls when every server reports its
//     running and queued requests in fresh telemetry, so independent
//     callers bound an owner alike;
//   - is widened when fresh telemetry shows the owner has no queue and no
//     KV cache at 90% or more (none reported counts as room), and a little
//     more when its KV cache is under 30%: a bound of a handful of calls is
//     passed by chance at light load;
//   - counts one waiting call with the KV cache under 50% as no queue, an
//     arrival between two of the server's steps.
//
// The balancer remembers, in a bounded table (Options.SpillMemory), which
// endpoints took a spill of a key. Later spills of that key prefer them, as
// they hold its prefix in their KV cache, and while the owner is above its
// fair share the key stays on such a warm endpoint instead of flapping home
// (one cached copy, not two).
//
// An owner that decodes several times slower than the next endpoint in a
// key's order keeps only the square of the fraction its speed is of that
// endpoint's (with 1.5x tolerance: 14% of its keys at 4x slower; always the
// same keys), so a throttled GPU does not hold its conversations to its
// speed.
//
// Affinity pays only when keys recur, and routing by hash costs the load
// balance P2C would give. So the balancer keeps a sampled estimate of how
// often its keys recur (tables of recent keys, 60 KiB) and, while fewer
// than Options.MinKeyReuse (5%) do, as with a stream of unique documents,
// it ignores the keys; it follows them again as soon as they recur. A key
// the caller named (Request.Session: a session header, prompt_cache_key, a
// conversation ID) is always followed and left out of the estimate.
//
// # Pricing the candidates
//
// Without an affinity owner to take the call, Pick samples two distinct
// endpoints by capacity weight that are ready and in good standing (slow
// start scales a joining or recovered endpoint's chance). The request's
// Scorer prices both from a State snapshot (in-flight requests and tokens,
// peak-EWMA latency, error rate, fresh telemetry) and the cheaper one wins.
//
// A Scorer whose price is only this process's view of an endpoint (a
// scoring.FullScanner: the Latency scorer of embeddings and rerankers) has
// every candidate of the group priced instead, up to Options.ScanLimit,
// and the cheapest wins: with no shared reading to herd on, two random
// choices would mostly miss the best endpoint.
//
// What goes into a price:
//
//   - Latency is kept per service, so on an endpoint that serves chats and
//     embeddings alike an embedding is priced by embeddings, not by chats.
//   - Ranks of a data-parallel attention engine (endpoints one membership
//     gives the same Options.DPGroupLabel value) step together, so a
//     prompt's price also says how far it would raise its engine's step
//     above the prefill of the engine's busiest rank, the candidate
//     included (a decaying per-rank estimate of the prompt tokens each was
//     recently sent).
//   - For generation calls, a price also counts the prompt tokens the
//     candidate was sent in the last half second or so and is likely still
//     prefilling (calls an affinity key placed excepted: their prefix is
//     cached; a rank of a data-parallel engine is priced by its engine's
//     step instead).
//   - When both candidates of a generation call have a measured decode
//     speed (the time per output token of their streamed calls), the
//     slower one's price is scaled by how much slower it is, so a slower or
//     throttled GPU takes fewer long generations.
//
// # Reading the answer
//
// The adapters read what a call was from the call:
//
//   - The HTTP transport peeks at a bounded head of the JSON body and, for
//     a body larger than the peek that is in memory or replayable (as the
//     OpenAI SDKs send it, model after messages), reads its top-level
//     fields past the peek too. A Triton (KServe v2) path names the call's
//     model.
//   - The HTTP transport reads a stream's events for time to first token
//     and decode speed (to the last token, and only from streams whose reader waited on the
//     endpoint: a reader slower than the endpoint finds the tokens waiting
//     and measures itself).
//   - An error event with a 5xx code (or the kind of error that TGI's and
//     the Messages API's events name instead) is the endpoint's failure.
//   - A server that sheds load without a Retry-After (Triton's queue full,
//     over HTTP or gRPC; SGLang's and Ollama's 503 queue full; the same in
//     a stream's error event) gives an overload answer, not a failure.
//   - An embedding or rerank call's latency runs to its response headers,
//     as the rest is the caller's pace of reading the body. An endpoint's
//     first such answer, and one during which a connection to it was set
//     up (Outcome.Dialed, which the HTTP transport's own Base reports),
//     is held aside and counted with the next: a handshake is no peak of
//     the endpoint's.
//   - A deadline that ends a stream after its first token counts as
//     neither success nor failure (a long answer outlasting the caller's
//     budget says nothing about the endpoint).
//   - A gRPC stream the server did not process (refused, or dropped by a
//     graceful GOAWAY) is an overload answer, not a failure. A dropped one
//     (Outcome.Drained: a restart, a draining sidecar) only cools the
//     endpoint down: it is no refusal, so it never starts the probation a
//     row of refusals does. Connection failures are failures.
//
// # Answers that are neither success nor failure
//
// The model is not served. An answer that the endpoint does not serve the
// call's model (vLLM's 404 for a LoRA adapter loaded elsewhere, Ollama's
// model not found, Triton's unknown model) is neither success nor failure:
// the Balancer remembers it (a bounded table of endpoint and model pairs,
// for NotServedMemory) and passes the endpoint over for that model's
// calls, and the HTTP transport sends the call on to another endpoint.
//
// One model fails. The adapters name the model of every call the server
// answered (Outcome.Model: successes, and the failures the server
// returned, not those of reaching it), so a model that fails on a server
// which serves others well (a crashed Triton model backend, a broken LoRA
// adapter) is held against that model there once the server has shown it
// serves the rest (a bounded table of runs of one model's failures per
// endpoint). The server's breaker, error rate and ejection see none of it,
// and after BreakerFailures that model's calls pass the server over, as
// for a model it does not serve.
//
// The call is too long. An answer that the call is longer than the
// endpoint's context window for its model (vLLM's, SGLang's or
// TensorRT-LLM's 400, TGI's 422, or the same text in a gRPC status) is
// neither too. The Balancer remembers the window (Outcome.ContextWindow)
// and passes the endpoint over for calls whose tokens do not fit it (a
// pooling call's longest input, Request.LongestInput, not its batch's
// total; a call of several sequences, n > 1 or a batch of prompts, by its
// longest, LongestInput + SequenceOutputTokens), and the HTTP transport
// (the gRPC policy with UnaryRetry) sends the call on to another endpoint.
//
// The call was bad or not allowed. Any other answer that the call was bad
// or not allowed (HTTP 4xx but 408, 424 and 429; the gRPC codes that map to them, UNAUTHENTICATED,
// PERMISSION_DENIED, INVALID_ARGUMENT, NOT_FOUND, ...) is a client error
// (Outcome.ClientError): neither success nor failure (the caller's own
// expired token, refused by every replica, trips no breaker) and no
// latency. The Balancer keeps each endpoint's decaying share of them and
// passes over a candidate whose share is far above the other's (and an
// affinity key's owner or sticky endpoint whose share is far above that of
// the key's next endpoints). So a replica with a wrong API key or a
// missing route, answering every call in a millisecond with nothing in
// flight, does not draw the calls its speed would (as a success, 1,998 of
// 2,000 embedding calls) nor keep the conversations it owns; taking none,
// it takes no part of the load the affinity bound shares either, as an
// endpoint whose breaker is open does not.
//
// Since a request's content decides a client error, and a tenant's shard
// takes its calls alone, only as many of a pool's endpoints may be passed
// over as outlier ejection may hold out (MaxEjectedFraction). A refusal of
// a keyed call whose key the affinity walk has moved past such an endpoint
// is the key's, counted for no endpoint: one user's refused session takes
// out its owner, not one endpoint after another.
//
// A client error that names its tenant (Outcome.Tenant, set by the
// adapters) also counts for that endpoint and tenant, in a bounded table
// keyed by the seeded hash of the tenant. An endpoint that refused a run
// of a tenant's calls too long to be the tenant's own bad calls (judged by
// the tenant's share of client errors, or by its answers at other
// endpoints during the run when some were served) is passed over for that
// tenant only (a replica its API key has not reached yet), for ErrorDecay,
// and the other tenants still draw it (EndpointStats.RefusedTenants counts
// the tenants it is passed over for).
//
// The caller gave up. A call its caller cancelled is neither success nor
// failure and feeds no EWMA, with two exceptions:
//
//   - An embedding or rerank call cancelled before the endpoint sent
//     anything back (Outcome.Unanswered: over HTTP before the response
//     headers, a stream's first token, or the first byte of an answer
//     whose headers announced no length; over gRPC with nothing received
//     or, through StreamTiming, in a RecvMsg that waited for a stream's
//     first message, or through UnaryOutcome or UnaryRetry, before a unary
//     generation call's message arrived) raises that service's latency to
//     its wait when the wait is longer, so a hung endpoint whose callers
//     give up on its calls stops drawing them.
//   - A generation call given up on with nothing back, after waiting as
//     long as the replica's answers take (its peers' longest before it has
//     answered one) and with none answered from then on (a busy replica
//     answering others while a user waits out a long call works), counts
//     towards a run its next answer or failure ends. Two or more in a row
//     price it up while calls are out to it (scoring.State.Abandoned), and
//     its affinity keys spill meanwhile, so a replica whose engine hangs
//     behind a live API server, its gauges frozen but fresh, takes one
//     call at a time until one is answered (it drew about half its share
//     before, over 60 s of a hang in TestHungLLMReplicaStopsDrawingCalls,
//     and so did one hung from its start in
//     TestHungLLMReplicaHungFromTheStart). Through such a run it takes no
//     part of the load the affinity bound shares either: its weight, its
//     hung calls and its frozen gauges counted, one hung replica of 8 left
//     its peers a bound a member's share too low, and their keys spilled
//     to cold caches.
//
// # Standing and recovery
//
// Each endpoint has a circuit breaker (github.com/sony/gobreaker/v2) that
// trips after consecutive failures; the balancer's own clock holds it out,
// doubling the time on each failed half-open probe round (probes that hang
// are overdue after as long, and one more goes; a probe wins its P2C
// comparison, whatever the outage left in the endpoint's cost), and a recovered
// endpoint ramps up through slow start (relative to the member furthest
// along when every member taking calls ramps, as after a whole new set or
// an outage of every connection: there is none at full weight to take
// more, and owners keep their keys).
//
// Outlier detection ejects an endpoint
// whose success rate falls well below the median of its peers serving the
// same model (of the fleet, without model labels). Breakers and
// ejections together hold out at most MaxEjectedFraction of a model's
// endpoints (of the fleet, without model labels), or one endpoint where
// that share is less than one (so a model on one endpoint can lose it);
// an Update that shrinks the pool does not end exclusions to fit. When too
// few endpoints are in good standing the picker routes
// across all ready ones (panic routing) rather than crushing the survivors.
//
// Adapters fail a call over to another endpoint only within a shared retry
// budget.
//
// Balancer.Close ends a Balancer: its endpoints give back their slots in a
// shared telemetry Store and later picks fail with balancer.ErrClosed,
// while calls already picked end normally. The HTTP Transport and the gRPC
// policy close a Balancer they made themselves, never one they were given.
//
// # Telemetry
//
// Samples from DCGM, model-server /metrics, a Prometheus server, ORCA and
// vLLM's load header are merged per endpoint and per field in a
// telemetry.Store, each field with the time it was measured (a Prometheus
// scrape's, not the query's). Scorers see only fresh fields; a stale or missing field is
// neutral. A telemetry.Poller tells its OnError of samples it could not
// use: for endpoints the Balancer does not know (UnknownEndpointsError),
// and already older than its TelemetryMaxAge as they arrive
// (StaleSamplesError: a Prometheus scraping less often than that). The LLM scorer's cost rises steeply (hyperbolically) as KV-cache
// use, GPU memory or utilization near their ceiling; GPU memory counts only
// for servers that report no KV cache (the engines that do pre-allocate it,
// so their memory shows their configuration, not their load) and are not
// marked as pre-allocating one (telemetry.KVCachePreallocated: TGI, llama.cpp,
// Triton's vLLM and TensorRT-LLM backends).
//
// A scraped load reading
// does not move until the next scrape, so the balancer counts the calls it
// has sent an endpoint since the reading was measured (from a per-second
// history of its in-flight count, for a reading that arrives late, as from
// Prometheus; scoring.State.InFlightSinceReading) and the LLM scorer adds them to the
// server's count, less those a newer queue reading (a load header's Waiting
// beside a scrape's Running) can already hold (and, while it shows a queue,
// not less those that ended: queued calls took their places), and those sent since the KV-cache use was measured
// (InFlightSinceKV: a load header's is newer than the scrape) to it; otherwise the endpoint that looked
// emptiest at the last scrape would take every pick until the next one, and
// a saturated fleet would herd.
//
// Affinity reads the same
// telemetry: an owner with an empty queue keeps its keys a little past the
// load bound (a spill costs a cold prefill), so does an owner whose spill
// target is queueing or nearly full too and has not cached the key (near
// saturation a cold spill trades a queue for a queue plus a prefill), and an owner near a full KV cache hands them to a
// clearly emptier neighbour.
//
// A reading of a process that may have
// restarted is dropped (telemetry.Store.Expire): the load fields an
// endpoint reported before its breaker tripped or outlier detection
// ejected it, and, in the gRPC policy, before its connection came back;
// otherwise the old process's last report (a full KV cache, a queue)
// priced the new, idle one out of rotation, with no call going there to
// bring a fresh one, until the reading aged out. A telemetry.Poller
// publishing into the Balancer scrapes again early after such a drop
// (PollerOptions.MinInterval).
//
// vLLM serving LoRA adapters runs at most --max-loras of them in one batch
// and holds a call for another until every running call of one of them
// has finished. Its /metrics (vllm:lora_requests_info) carries the slots
// and the adapters running and waiting (telemetry.LoRASlots with
// telemetry.Sample.Adapters), brought up to now with this process's own
// calls in flight per adapter (a reading is as old as its scrape); for a
// call naming an adapter, a server whose slots are all taken by others is
// out of bound for the call's affinity key and a P2C candidate drawn again
// (twice at most) that loses to one that is not full, and the LLM scorer
// multiplies its cost by LoRAWait (16), that of a server that would load
// the adapter into a free slot by LoRALoad (1.5). An adapter with at most
// one endpoint's fair share of this process's calls in flight on the
// endpoints that serve it goes to a home endpoint, by a seeded key of the
// adapter's own (spilling along the ring under the load bound), instead of wherever its sessions' prompt
// keys lead: a rarely asked adapter then takes a slot on one endpoint,
// not on every one (balancer.Options.AdapterHomes). Base-model calls and
// servers without the reading are untouched.
//
// A vLLM server put to sleep (--enable-sleep-mode, POST /sleep) serves
// nothing until it is woken, yet reports an idle scheduler and an empty KV
// cache. Its vllm:engine_sleep_state (telemetry.Asleep) makes it, while
// fresh, an endpoint that cannot serve now, as a server whose LoRA slots
// are full is: a P2C candidate drawn again that loses to an awake one, an
// affinity owner whose keys spill, priced 1e6 times by the LLM scorer. With
// every endpoint asleep calls still go to them, to wait for the wake-up.
//
// # Design choices
//
// Some choices of the implementation, and why they were made:
//
//   - The circuit breaker (gobreaker) learns of a call at Done, not before
//     it is sent: gobreaker's two-step Allow takes a mutex and returns a
//     heap closure, which Pick cannot afford (it never blocks, locks or
//     allocates), and gobreaker reads the wall clock, which would leave
//     fake clocks and the fleet simulator inexact. The breaker decides when
//     to trip, probe and close; the balancer's injected clock holds the
//     endpoint out, and the half-open probe budget is an atomic that Pick
//     reads.
//   - Slow start scales how often an endpoint is a candidate, not its cost:
//     scaling both made an idle joiner lose every comparison until its
//     window ended, a step rather than a ramp.
//   - The telemetry Store keeps each field with its own observation time,
//     so a fresh queue depth from the model server is not hidden by a stale
//     GPU reading from DCGM.
//   - balancer.New returns *Balancer and panics on invalid Options, which
//     in code are a programming error; configuration parsers, whose input
//     is not code, call Options.Validate first and get an error that names
//     the field.
//   - Balancer.PickExcept serves failover, so a retry never lands on the
//     endpoint that just failed; Balancer.PickRetry is PickExcept under the
//     retry budget, spent only when the retry has somewhere to go.
//   - Choices that the fleet simulator decided are documented with their
//     figures where they live (Options.LoadBound, Options.SpillMemory,
//     Options.StickyTTL).
package inferlb
