// Package inferlb is an embeddable client-side load balancer for AI inference
// traffic: every process that imports it routes its own calls to a fleet of
// LLM, embedding and reranker servers (vLLM, SGLang, TensorRT-LLM, Triton,
// TGI), with no proxy in the path.
//
// This root package holds the vocabulary every other package shares:
// Endpoint, Request, Service, Outcome, and NewContext / FromContext for
// transports that see only a context.
//
// # Packages and dependency direction
//
// Imports point down this list only; no core package (the first five) imports
// gRPC or net/http, which a test enforces.
//
//	inferlb (root)          vocabulary; standard library only
//	telemetry               Sample, Sink, Store (latest value of each field, with its age)
//	cache                   seeded affinity keys, consistent placement, sessions; xxhash only
//	scoring                 Scorer and per-service scorers: pure cost functions
//	balancer                the P2C core: durable endpoint state, immutable snapshots
//	balancer/grpcbalancer   gRPC load-balancing policy "inferlb"
//	balancer/httpbalancer   http.RoundTripper for OpenAI-compatible APIs
//	telemetry/dcgm, telemetry/modelserver, telemetry/promapi   telemetry sources
//	benchmarks, examples    fleet simulator and runnable programs
//
// # The life of one request
//
// An adapter turns a call into a Request (service from the path or method,
// model, token estimates, affinity key, tenant) and asks the Balancer to Pick.
// Pick loads the current immutable snapshot, chooses the group that serves
// the model, and samples two distinct endpoints by capacity weight that are
// ready and in good standing (slow start scales a new endpoint's chance). The
// request's Scorer prices both from a State snapshot (in-flight requests and
// tokens, peak-EWMA latency, error rate, fresh telemetry) and the cheaper one
// wins. Pick counts the call in flight and returns a Pick handle; the adapter
// sends the call and, when the response or stream has ended, reports an
// Outcome through Done exactly once. Done releases the load and feeds the
// latency and error EWMAs; an overload answer cools the endpoint down for its
// Retry-After. Pick never blocks, locks or allocates.
package inferlb
