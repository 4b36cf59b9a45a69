package inferlb

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// Service is the kind of work a request asks for. Each kind is scored
// differently: LLM generation on reliability and current load, embeddings and
// rerankers on recent latency.
type Service uint8

const (
	// ServiceUnknown is a request the caller did not classify; it is routed
	// to the least-loaded endpoint.
	ServiceUnknown Service = iota
	// ServiceLLM is text generation (chat, completions, responses).
	ServiceLLM
	// ServiceEmbedding is an embedding call: short, uniform work.
	ServiceEmbedding
	// ServiceRerank is a reranker (cross-encoder scoring) call.
	ServiceRerank

	// NumServices is the number of Service values; useful to size arrays.
	NumServices = int(ServiceRerank) + 1
)

var serviceNames = [NumServices]string{"unknown", "llm", "embedding", "rerank"}

// String returns the lower-case name used in configuration ("llm", ...).
func (s Service) String() string {
	if int(s) < NumServices {
		return serviceNames[s]
	}
	return fmt.Sprintf("Service(%d)", uint8(s))
}

// ParseService maps a configuration name to a Service. It accepts the names
// String returns, "" for ServiceUnknown, and the common aliases
// "generation", "chat", "completion", "completions", "embed", "embeddings",
// "reranker" and "reranking"; case and surrounding spaces are ignored.
func ParseService(name string) (Service, error) {
	switch strings.ToLower(strings.TrimSpace(name)) {
	case "unknown", "":
		return ServiceUnknown, nil
	case "llm", "generation", "chat", "completion", "completions":
		return ServiceLLM, nil
	case "embedding", "embeddings", "embed":
		return ServiceEmbedding, nil
	case "rerank", "reranker", "reranking":
		return ServiceRerank, nil
	}
	return ServiceUnknown, fmt.Errorf("inferlb: unknown service %q (want llm, embedding, rerank or unknown)", name)
}

// Endpoint is one backend replica.
//
// ID identifies the endpoint's durable state (load counters, latency history,
// breaker) across membership updates and is what consistent hashing places keys
// on, so every caller must use the same ID for the same replica; it defaults to
// Addr. Weight is the relative capacity (a replica on two GPUs might be 2); 0
// means 1. Power-of-two choices and the affinity ring both keep weights'
// ratios up to balancer.MaxWeight, so weights may be given as, say, tokens
// per second (100 and 800); the ring bounds its size by giving every member
// the same fraction of its points when the fleet's weights sum past 10,485
// or past its number of endpoints, whichever is more (cache.MaxRingPoints),
// so a change of the sum then also moves about its relative change of the
// keys between replicas that stayed (one replica of weight 1,000 joining 20
// moves 4.9% of the keys to it and 4.0% between the 20; cache.Placement).
// Weights of 1 or less are never scaled. Give a
// standard replica weight 1 or more: the ring gives a member one point per
// 0.01 of weight (in a fleet within that sum), so its share of keys strays
// from its weight by about 1/sqrt(100 x weight) (100
// replicas of weight 1: the busiest owns 1.3x the mean share; of weight
// 0.1, 2.1x; go test -run TestSmallWeightsSpreadKeysUnevenly -v ./cache/). Labels carry facts such as "model" (comma-separated served model
// names, LoRA adapters included), "version", "host", "pod" or "dp_group".
// The balancer reads "model" and "dp_group" only (or the labels
// balancer.Options.SubsetLabel and DPGroupLabel name instead); the others
// change no routing of themselves, but a custom Scorer may read them
// (scoring.State.Endpoint).
// A request pinned to a version names it as a model: list the version's
// name among the endpoint's models ("llama,llama@v2"), not in "version".
type Endpoint struct {
	ID     string
	Addr   string
	Weight float64
	Labels map[string]string
}

// Key returns the endpoint's identity: ID, or Addr when ID is empty.
func (e Endpoint) Key() string {
	if e.ID != "" {
		return e.ID
	}
	return e.Addr
}

// Capacity returns Weight, with 0 (and any non-positive, NaN or infinite
// value) read as 1, as the balancer and the placement ring read them.
func (e Endpoint) Capacity() float64 {
	if e.Weight > 0 && e.Weight <= math.MaxFloat64 {
		return e.Weight
	}
	return 1
}

// Request is what the balancer knows about one call. Adapters fill it from
// the HTTP request or gRPC call; the zero value is a valid unclassified request.
type Request struct {
	// Service picks the Scorer the call is priced with (see Service):
	// the zero value, ServiceUnknown, goes to the least-loaded endpoint.
	Service Service
	// Session says AffinityKey names a session the caller chose (a session
	// header, prompt_cache_key, a conversation ID, a gRPC key from
	// metadata), not a hash of the prompt: the balancer follows it
	// whatever its estimate of how often prompt keys recur (MinKeyReuse),
	// and it does not count in that estimate.
	Session bool
	// SequenceOutputTokens is, for a call of several sequences (LongestInput
	// > 0 on a call that is not a pooling call: see LongestInput), the
	// output bound of one sequence: max_tokens as asked, where
	// MaxOutputTokens counts it times n and times the prompts; 0 when the
	// call gives none. It is ignored otherwise, and does not count as load.
	// (An int32 here, beside Service and Session, takes no room: a Request
	// is part of every call's state.)
	SequenceOutputTokens int32
	// Model names the model asked for; when endpoints carry a "model" label,
	// only endpoints serving it are eligible.
	Model string
	// AffinityKey routes related requests (a conversation, a shared prompt
	// prefix, a session) to the same endpoint. 0 means no affinity. Make
	// it with the Balancer's cache.Keyer (or another keyed hash under a
	// secret seed), never from request data as it comes: a key a client
	// can compute is an endpoint, and a table set, it can aim at.
	AffinityKey uint64
	// Tenant identifies the caller's customer, for isolation policies.
	Tenant string
	// PromptTokens and MaxOutputTokens estimate the work; they are added to
	// the endpoint's in-flight tokens for the life of the call.
	PromptTokens    int
	MaxOutputTokens int
	// LongestInput estimates, for a pooling call (ServiceEmbedding,
	// ServiceRerank, and a ServiceUnknown call that names no model, such
	// as TEI's /predict), the tokens of its longest single input: one text of
	// an embeddings batch, or a rerank's or score call's query with its
	// longest document. A pooling server bounds each input by its context
	// window, not the call, so the balancer weighs this against the
	// windows it remembers (Outcome.ContextWindow) where it weighs Tokens
	// for other calls; 0 means unknown, and a pooling call is then checked
	// against no window. It does not count as load.
	//
	// For any other call, LongestInput > 0 says the call generates several
	// sequences (n > 1 choices, or a batch of prompts such as a
	// completions prompt given as a list), and is the tokens of its
	// longest prompt. A server checks each sequence on its own, one prompt
	// with the output bound of one sequence (vLLM: prompt plus max_tokens
	// against max-model-len, whatever n), while PromptTokens and
	// MaxOutputTokens count every sequence: the balancer then weighs
	// LongestInput + SequenceOutputTokens against the windows it remembers,
	// and LongestInput against limits on the prompt alone
	// (Outcome.PromptWindow), in place of Tokens and PromptTokens. 0: the
	// call is one sequence (or not known to be several), weighed by Tokens.
	LongestInput int
}

// Tokens is the request's token estimate: prompt plus maximum output, never negative.
// A negative part counts as 0, and the sum saturates rather than wrap.
func (r *Request) Tokens() int64 {
	p, o := max(int64(r.PromptTokens), 0), max(int64(r.MaxOutputTokens), 0)
	if p > math.MaxInt64-o {
		return math.MaxInt64
	}
	return p + o
}

// Outcome is how a call ended, reported once through the pick's Done.
type Outcome struct {
	// Err is nil for success. A context.Canceled error is the client's own
	// doing and counts as neither success nor failure.
	Err error
	// Unanswered says a cancelled call (Canceled) was given up on by its
	// caller while the endpoint had sent nothing back: over HTTP before
	// the response headers arrived, or for a stream (server-sent events),
	// in a Read that waited for its first token (a server sends a
	// stream's headers at once, before any token, also when its engine
	// hangs), or for another answer whose headers announced no length (a
	// gateway or server that flushes them before the answer exists), in
	// a Read before its first byte; over gRPC with nothing received
	// (balancer.DoneInfo.BytesReceived false), or for a stream timed by
	// grpcbalancer.StreamTiming, in a RecvMsg that waited for its first
	// message (its headers came at once), or for a unary generation call
	// through grpcbalancer.UnaryOutcome or UnaryRetry, before its message
	// arrived (a server may send its headers first). The adapters set it only
	// when the caller's own context (or an http.Request's Cancel channel)
	// ended the call (over gRPC, the attempt's context, which an
	// interceptor inside may end, as a per-attempt timeout does: see
	// grpcbalancer.UnaryOutcome for a hedge's loser), never for the ends they report as canceled to blame
	// no one (the caller's request body failing, a panic, a call not
	// sent, the handling of a "model not served" answer), nor for a
	// cancellation after the answer began (a user stopping a stream it
	// was reading). It means nothing without Canceled.
	//
	// A cancelled call gives no latency sample, and a hung endpoint whose
	// callers give up on its calls would look as fast as its last answer.
	// For an embedding or rerank call (short, uniform work, priced by its
	// latency) the balancer reads such a call's wait, pick to cancel, as a
	// lower bound on the endpoint's latency for that service: when the
	// wait is longer than the latency the scorer would see, it raises it
	// to the wait (never lowers it). A generation's wait is no latency:
	// a non-streamed one sends nothing until it is done, so a user who
	// stops a long one says little about the replica. But a wait at least
	// as long as the replica's generation answers take (before it has
	// answered one, its peers' longest), with no generation answered (nor
	// the first token of a stream its caller then stopped: a stream still
	// out tells the balancer nothing until it ends) by the replica from
	// that point of the wait on, counts towards a
	// run of such calls that its next answer or failure ends; the LLM
	// scorer prices two or more in a row while calls are out to it (a
	// hung engine behind a live API server: see scoring.State.Abandoned).
	// For unclassified calls it changes nothing.
	Unanswered bool
	// Overloaded marks an explicit "too busy" answer (HTTP 429, or 503
	// with Retry-After; gRPC RESOURCE_EXHAUSTED, or a stream the server
	// refused or drained without processing it): the endpoint is cooled
	// down, not failed.
	Overloaded bool
	// Drained qualifies Overloaded: the endpoint did not process the call
	// because its connection was closing, not because it was busy (over
	// gRPC, a stream an HTTP/2 GOAWAY dropped unprocessed: a graceful
	// restart, a draining sidecar, MaxConnectionAge; and an attempt gRPC
	// ended with nothing back, which may have been one). The endpoint cools
	// down as for an overload answer, so that the call's retry goes
	// elsewhere, but the answer is no refusal: it neither counts towards
	// a row of overload answers nor ends one, so it never puts the
	// endpoint on probation (see balancer.Options.DefaultCooldown), which
	// is for a replica that keeps saying it is too busy. Without
	// Overloaded it changes nothing.
	Drained bool
	// Dialed says the call's latency may include setting up a new
	// connection (a TCP dial, a TLS handshake) that the endpoint's next
	// calls, on that connection, do not pay: a call whose connection was
	// closed while the endpoint drew no calls (an idle timeout), or one of
	// calls sent together while a connection was set up for another. For
	// an embedding or rerank call (priced by its latency, where one slow
	// sample is the peak) the balancer holds such a success's latency
	// aside and counts the smaller of it and the endpoint's next answer's,
	// as it does an endpoint's first answer; a sample that counts is thus
	// always the latency of one of the endpoint's calls, never less. For
	// other calls, and other outcomes, it changes nothing. httpbalancer
	// sets it with its default Base (see httpbalancer.Options.Base).
	Dialed bool
	// RetryAfter is the server's hint for how long to stay away (0 = none).
	RetryAfter time.Duration
	// Latency is the whole call, pick to end of response. 0 means "measure
	// it for me": the balancer uses the time since the pick.
	Latency time.Duration
	// TTFT is time to first token for streamed generation (0 = unknown).
	TTFT time.Duration
	// OutputTokens is how many tokens the response carried (0 = unknown).
	OutputTokens int
	// NotServedModel, when not empty, says the endpoint answered that it
	// does not serve this model (vLLM's 404 "The model `x` does not exist."
	// from a replica without that LoRA adapter, Ollama's 404 "model not
	// found", Triton's "Request for unknown model"). The call counts as
	// neither success nor failure, and the balancer passes the endpoint
	// over for that model's calls for a while (balancer.Options.
	// NotServedMemory). It takes precedence over Err and Overloaded; a
	// cancellation (Canceled) over it.
	NotServedModel string
	// ContextWindow, when positive, says the endpoint refused the call as
	// longer than its context window for the call's model, of this many
	// tokens (vLLM's 400 "This model's maximum context length is N
	// tokens", SGLang's alike, TGI's 422): fleets whose replicas were
	// started with different max-model-len, or on GPUs of different
	// memory, refuse on some replicas what others take. The call counts as
	// neither success nor failure, and the balancer remembers the window
	// for the endpoint and the call's Model (empty: the calls that name
	// none, apart from every named model), so that a call whose tokens
	// (Request.Tokens; a pooling call's LongestInput; a call of several
	// sequences its longest, LongestInput + SequenceOutputTokens) do not
	// fit it goes elsewhere while another endpoint may take it. It takes
	// precedence over Err and Overloaded, after NotServedModel.
	ContextWindow int
	// PromptWindow says ContextWindow bounds the prompt alone, not the
	// prompt and output: TGI's max-input-tokens ("`inputs` must have less
	// than N tokens"), TensorRT-LLM's maximum input length. The balancer
	// then weighs a call's prompt (Request.PromptTokens; LongestInput for
	// a pooling call and for a call of several sequences) against it, and
	// remembers it apart from the
	// endpoint's window for prompt and output: remembered as that, a limit
	// on the prompt would pass the endpoint over for short prompts asking
	// for long answers, which it takes.
	PromptWindow bool
	// ClientError says the endpoint answered that the call was bad or not
	// allowed, without doing its work: HTTP 4xx other than 408, 424 and
	// 429 (400, 401, 403, 404, 405, 409, 413, 422, ...), gRPC
	// INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED, NOT_FOUND,
	// FAILED_PRECONDITION, OUT_OF_RANGE, ALREADY_EXISTS and ABORTED. Such
	// an answer comes in a millisecond and leaves nothing in flight, so
	// counted as a success a replica with a wrong API key or a missing
	// route (all its answers 401 or 404) looked the fastest and least
	// loaded of all and drew nearly every call. As a failure it would be
	// worse: when the caller's own token expires every replica answers
	// 401, and every breaker would trip. So the call counts as neither
	// success nor failure and gives no latency sample; the balancer keeps
	// a decaying share of each endpoint's answers that were client errors,
	// and passes over an endpoint whose share is far above the other
	// candidate's (see package balancer), which shuns the misconfigured
	// replica while the caller's own bad calls, refused by every replica
	// alike, change no choice. It takes precedence over Err, after
	// NotServedModel, ContextWindow and Overloaded (a 404 naming the model
	// is NotServedModel, a refusal as too long ContextWindow); a
	// cancellation (Canceled) over all of them.
	ClientError bool
	// Model is the model of a call the server answered: set it on a
	// success and on a failure the server itself returned (an HTTP 5xx
	// answer, an error event in a stream, a gRPC status the server sent),
	// never on a failure to reach it or a connection that broke, which
	// are the endpoint's. A server that serves several models can fail
	// one while it serves the others: with Model set, the balancer holds
	// such failures against that model on that endpoint instead of
	// against the endpoint, once the endpoint has served other calls
	// meanwhile (see package balancer). On a success it also tells a
	// model some endpoint serves from made-up names, whose "not served"
	// answers then give up each other's entries in the memory of where it
	// is not served before its own (balancer.Options.NotServedMemory).
	// Empty, every failure is the endpoint's. The HTTP and gRPC adapters
	// set it from the call's model.
	Model string
	// Tenant is the call's Request.Tenant. On a client error it tells a
	// replica that refuses one tenant's calls only (its API key not
	// provisioned there yet) from one that refuses everyone's: after a
	// few of the tenant's calls refused there in a row, the tenant's
	// calls pass the replica over for a while, and the other tenants'
	// go on as before (see package balancer). On a success it ends that
	// memory for the replica. Empty, client errors count only towards
	// the endpoint's share. The HTTP and gRPC adapters set it.
	Tenant string
}

// Canceled reports whether the outcome is the client's own cancellation, which
// says nothing about the endpoint's health.
func (o Outcome) Canceled() bool {
	return o.Err != nil && errors.Is(o.Err, context.Canceled)
}

type requestKey struct{}

// NewContext returns a copy of ctx carrying req, for transports that see only
// a context (gRPC's picker). The request must not be modified afterwards.
func NewContext(ctx context.Context, req *Request) context.Context {
	return context.WithValue(ctx, requestKey{}, req)
}

// FromContext returns the request stored by NewContext, if any.
func FromContext(ctx context.Context) (*Request, bool) {
	r, ok := ctx.Value(requestKey{}).(*Request)
	return r, ok && r != nil
}
