// Package httpbalancer is an http.RoundTripper that balances AI inference
// traffic (OpenAI-compatible APIs by default) across endpoints with inferlb's
// power-of-two-choices core, inside the calling process.
//
// Wrap the client you already have; the request URL's host is a logical name
// that the transport replaces, per request, with the picked endpoint:
//
//	t, err := httpbalancer.NewTransport(httpbalancer.Options{
//		Endpoints: []inferlb.Endpoint{{Addr: "10.0.0.5:8000"}, {Addr: "https://10.0.0.6:8443"}},
//	})
//	if err != nil {
//		return err // an invalid endpoint or option: t is nil
//	}
//	defer t.Close()
//	client := &http.Client{Transport: t}
//	resp, err := client.Post("http://llm.internal/v1/chat/completions", "application/json", body)
//	if err != nil {
//		return err
//	}
//	defer resp.Body.Close() // the call ends, and its outcome is reported, when the body does
//
// An endpoint's ID, which telemetry samples name it by, is its Addr as given
// unless Endpoint.ID is set: "https://10.0.0.6:8443" above, scheme included.
// Each server is listed once: two entries naming one host and port, however
// spelled ("10.0.0.5:8000" and "http://10.0.0.5:8000/"), are an error that
// names both (see Options.Endpoints).
//
// Read or close every response body: until then the balancer counts the
// call in flight on its endpoint.
//
// Headers go to whichever endpoint is picked, as the caller set them: an
// API key, and the Authorization that http.Client makes of the URL's user
// information ("http://user:pass@llm.internal/...") before the transport
// sees the request. Endpoints that need different credentials need a Base
// (or a RoundTripper inside it) that sets them per endpoint host.
//
// TLS: net/http checks an https endpoint's certificate against the address
// it dials, the picked endpoint's, so a fleet addressed by IP whose servers
// carry a certificate for a service name needs that name in the Base's
// TLSClientConfig.ServerName (or IP SANs in the certificates).
//
// # One request
//
// RoundTrip reads ahead at most Options.MaxPeek bytes of a JSON body
// (DefaultMaxPeek, 1 MiB) and asks the Inspector what the call is: the
// service from the path, and model, stream, output bound (max_tokens times
// n times the prompts of a batch: a completions prompt, or SGLang's text or
// input_ids, given as a list of prompts; a count read as vLLM's and
// SGLang's pydantic reads it, also 1e3, 512.0 or a string such as "512"
// or " +1_024 "), a prompt token
// estimate and a prompt affinity key from the body (a prompt given as token
// IDs is keyed on its leading IDs; vLLM's cache_salt scopes the key, as it
// scopes the server's prefix cache; each estimate is capped at
// MaxTokenEstimate, so a made-up size counts as one large request). A
// session header beats
// the prompt key, and is scoped by the body's cache_salt too. The body is then forwarded byte for byte: the bytes read
// ahead followed by the rest of the caller's body, whatever its size or
// content. (A body held in memory, as http.NewRequest makes of a
// bytes.Reader, strings.Reader or bytes.Buffer, is not read at all: its head
// is copied and the body itself is sent.) A body larger than the peek keeps
// its top-level model, stream, output bound and session IDs readable when
// it is in memory or the caller set GetBody: the OpenAI SDKs write the
// model after the messages, so a request carrying an image or a long
// document would otherwise be routed without its model. The default
// Inspector (an *OpenAI) then sees a fresh copy from GetBody, which it reads past the peek without
// reading it when it is in memory, and that copy is what the first attempt
// sends; GetBody must give the bytes of Body, as net/http assumes when it
// resends one. (A copy in memory whose length or first bytes differ from
// the body's, a GetBody left over from before Body was replaced, is not
// used, here or for a failover.) Picking happens per request, never per connection, so keep-alive
// cannot pin a client to one backend. A
// canceled context ends a read-ahead that is waiting on the caller's body.
// When the caller's body itself fails (a gateway's client dropped its
// upload), the call fails with that error and no endpoint is blamed: failing
// during the read-ahead, nothing is sent; failing while it is sent (or
// GetBody's copy, while a failover sends it), the
// attempt counts as canceled and is not retried elsewhere. (A body that is
// not read ahead, MaxPeek < 0 or not JSON, is passed to Base untouched, so
// its failure is Base's error like any other.) Nor is an endpoint blamed
// for a request that net/http refuses to send (a method, header or trailer
// field that is not valid HTTP, such as a header value with a line break; a
// control character in the URL; a scheme other than http and https; a body
// read ahead, or in memory, or a GetBody copy, whose length is not its
// ContentLength; to an
// https endpoint, a header field HTTP/2 forbids, such as Upgrade): it fails
// with Base's error and is not retried elsewhere. (A nil Header, which
// http.Client fills in and net/http's Transport refuses, is sent as an
// empty one.) A Base that panics (a middleware's bug, a mock's failed
// assertion) panics through RoundTrip as it came, and a response body from
// Base that panics through its Read or Close; the call is finished on the
// way out, blaming no endpoint (the panic is the caller's code) and
// counting as canceled, and is not retried. A GetBody that panics as a
// failover replays the body panics through alike, its failed attempt
// reported as failed.
//
// The outcome is reported to the balancer when the response body ends (EOF,
// the last of the bytes its Content-Length announced, Close or a read
// error), not when the headers arrive (but for an answer that has no body:
// a HEAD's, a 204, a 304, or one whose length is known to be zero: a
// Content-Length of 0, or over HTTP/2 a stream that ended with its
// headers; such a body need not be read nor closed), though an embedding
// or rerank call's latency runs only to its headers (the server has
// computed the answer by then; how fast the body is read is the caller's
// pace, and one slow reader would make the endpoint look slow); for server-sent
// event streams (whose lines may end with a LF, a CRLF or a bare CR, as
// EventSource reads them; an event whose JSON comes over several data
// lines, which the SSE framing joins with line breaks, is read as that one
// JSON value, at the blank line that ends the event) the transport also records time to the first event that
// carries tokens, the number of such events (the output token estimate,
// unless the stream gives the server's exact count, reported as
// Outcome.OutputTokens: the usage.completion_tokens of the usage chunk
// that ends a stream that asked stream_options.include_usage, the
// usage.output_tokens of a Messages API stream's message_delta event
// (vLLM's, Anthropic's), the response.usage.output_tokens of a Responses
// API stream's response.completed or response.incomplete event, the
// eval_count of an Ollama stream's last object; each read only at its
// place in that event's JSON, not from text or a tool call's arguments
// that hold the same name, and only from an event that ended: a stream
// cut inside that event's line, or before the blank line of an event
// over several data lines, gives none) and the mean gap between
// them, timed as the caller reads them. A caller that
// comes to read the body late after the headers (away for over 1/8 of the
// time to the first event) finds the first events waiting: unless the Read
// that delivers the first one waits for it, its time is unknown (TTFT 0),
// and the stream teaches the balancer no decode speed. Nor does a stream
// read slower than the endpoint sends it, which finds every next event
// waiting (see Result.TimeBetweenTokens). The lifecycle events of the Responses and
// Messages APIs (response.created, message_start, ...), "error" and "ping"
// events are not counted, nor are the chunks of OpenAI-style streams that
// carry no token: the role chunk that opens a chat stream (a delta with the
// role and no text; time to first token is the first token's chunk's), the
// finish chunk whose delta is empty ({}, with the finish_reason: OpenAI's,
// SGLang's, llama.cpp's) and the usage chunk of
// stream_options.include_usage (its choices are []). Ollama's newline-delimited JSON streams
// (application/x-ndjson) are read alike, a line an event; the last
// object (its own "done": true, not one in a tool call's arguments) is
// not counted, and an error line (Ollama checks
// the request before it streams, so a failure after is the server's: a
// runner that crashed) is a failure, as a 5xx error event is. A stream is read as Base returns it: one the
// server compressed because the caller set Accept-Encoding itself (Base
// only decompresses what it asked for) reaches the caller as it came and
// is not read for events (nor is any stream with a Content-Encoding other
// than identity): no events, no time to first token, the outcome at its
// end as for any other body (and a deadline that ends it is a failure: no
// first token was seen). Leave Accept-Encoding to Base (net/http's
// Transport then asks for gzip and decompresses it) to have a compressed
// stream read. Classification: 429 (and 529, Anthropic's
// "overloaded", which gateways answer), and 503 with Retry-After (or
// retry-after-ms), are overload answers (the endpoint cools down for the
// server's hint, it is not failed: retry-after-ms, the milliseconds Azure
// OpenAI and other OpenAI-compatible gateways send, read first as the
// OpenAI SDKs read it, else Retry-After, in seconds (a fraction, such as
// "1.5", counts, as it does for the SDKs) or an HTTP date;
// refusing again a call sent at that time, it is second choice for a
// while after: see balancer.Options.DefaultCooldown), and so is the 503
// with which Triton and SGLang shed load (its
// body, once read, says "Exceeds maximum queue size" or "Request timeout
// expired", Triton's, "The request queue is full.", SGLang's, or
// "maximum pending requests exceeded", Ollama's; a cooldown for the
// default time); other 5xx, the 424 of TGI and TEI (inference failed) and transport errors
// are failures, and so is a stream
// that reports an error object with a 5xx code after it started ("data:
// {"error": {..., "code": 500}}", as vLLM and SGLang do when generation
// fails; a 429 there is an overload answer, another 4xx a client error; the
// code is the error object's
// own member, or the top-level object's, read as the line streams by
// however long the message before it). TGI's error events carry no code
// (or a 422 whatever the error, on its OpenAI-compatible routes), and TGI
// checks a streamed request and queues it only after the 200 headers: its
// error_type, else the error's text, says which it is ("Model is
// overloaded": an overload; a failed or cut generation: a failure), and
// an error event whose text says the server shed the call is an overload
// whatever its 5xx code (SGLang's "The request queue is full.", code 503,
// on a 200 stream). The Messages API's error event (event: error, data:
// {"type": "error", "error": {"type": kind, ...}}, which vLLM and SGLang
// send on /v1/messages) says it by its kind: internal_error and api_error
// are failures, overloaded_error and rate_limit_error overloads, other
// kinds the request's. The Responses API's (event: error, data: {"type":
// "error", "code": code, ...}) says it by its string code: server_error a
// failure, rate_limit_exceeded an overload, others (invalid_prompt, ...)
// the request's; its response.failed event, a response that failed after
// the stream began, says it by the failed response's error code, read as
// the line streams by (it follows the response's output): the same codes
// the same way, other codes (context_length_exceeded, the image errors)
// the request's, and no code a failure; a canceled context (or a closed
// Request.Cancel, which http.Client sets with a Timeout, closed before the
// context's deadline: at it, Client.Timeout is the deadline's) is neither
// (before the response headers, in a Read that waited for a stream's
// first token, or in a Read before the first byte of another answer whose
// headers announced no length, it is reported Unanswered: the balancer reads an
// embedding's or rerank's wait as a lower bound on the endpoint's
// latency, and a generation's, as long as its answers take, towards a
// run that prices a hung replica up; vLLM sends a stream's headers before
// its first token, also when its engine hangs, and a gateway or server
// that flushes a JSON answer's headers at once sends them before the
// answer exists, without its length; a reader that comes back
// to a stream only to give up may have left a token waiting, and is not;
// the ends this transport reports as canceled to blame no one, such as
// the caller's own body failing, are not), and so is a deadline that ends a stream after its first token, or another
// answer's body after its headers (ErrDeadlineMidStream), but for a body
// whose headers announced no length and that a Read gave up on before its
// first byte: that deadline is the endpoint's failure, as before the
// headers; a Close before EOF is a success (a JSON decoder stops at the
// closing brace), also when it makes a Read blocked in another goroutine
// fail. A call that fails on an endpoint, before any response (RoundTrip's
// error, from the last endpoint tried) or in its body (Read's: a reset, a
// server gone mid-stream), fails with an *EndpointError that names the
// endpoint and wraps the error underneath, which errors.Is and errors.As
// find (io.EOF, io.ErrUnexpectedEOF, a net.Error); the end of a body is
// io.EOF itself, and the context's end context.Canceled or
// context.DeadlineExceeded itself, which callers compare with == (or
// the cause the caller gave it, context.WithCancelCause's).
// vLLM's per-response endpoint-load-metrics header feeds the endpoint's
// telemetry whenever a response carries it; Options.LoadReports asks every
// endpoint to send it. A report is kept until a newer one replaces it or
// it ages out (balancer.Options.TelemetryMaxAge), and is expired when the
// endpoint's failures hold it out of rotation (a tripped breaker, an
// outlier ejection): vLLM sends the header only with non-streamed
// responses, and a crashed replica that restarted would otherwise be
// priced by its old process's last report. Options.OnResult sees every attempt's outcome, for
// metrics.
//
// A Responses API follow-up (/v1/responses with previous_response_id)
// carries only its new input; the server that made the response it names
// holds the conversation (in its KV cache and, for vLLM and SGLang, in an
// in-memory store of responses). The transport remembers, for a while
// (Options.ResponseMemory), the affinity key behind each response it passes
// (the ID is read from the first bytes of the answer or the stream's first
// event) and the endpoint that made it, and sends a follow-up to that
// endpoint while it can take the call, whatever its load (balancer.PickAt),
// also when it names a prompt_cache_key; else with that key, or the key of
// the turn it continues, so a conversation stays together however many
// turns it has.
//
// Affinity keys come from the Balancer's Keyer unless Options.Keyer is set,
// so a fleet of callers that share the Balancer's AffinitySeed agree on
// where each prompt and session lives (with Options.Keyer set, they need
// Keyers of the same seed too: the AffinitySeed still places the keys);
// times (TTFT, load report stamps) come from the Balancer's clock.
//
// # One Transport per tier
//
// The path picks the scorer, not the endpoints: a Transport sends every call
// to any of its endpoints that serves the call's model, and a call that names
// no model (Hugging Face TEI's native /embed and /rerank bodies carry none)
// may go to any of them (a Triton or KServe v2 call names its model in the
// path, /v2/models/{name}/..., which counts). So give each tier (LLM, embedding, reranker) its own
// Transport over its own servers. One Transport over several tiers works only
// if every endpoint lists its models and every call names one.
//
// # Failover
//
// A call that fails before any response arrives (connection refused or
// reset, TLS failure) is retried once on another endpoint if its body can
// be sent again (the caller set GetBody, or the whole body fit in the peek),
// its context is live, and the Balancer's retry budget allows (at most
// RetryRatio of traffic, default 20%, plus RetryFloor per second). The retry
// is picked with Balancer.PickRetry, so it never lands on the endpoint that
// just failed, and the budget is spent only when another endpoint can take
// it (a failover with nowhere to go retries nothing and spends nothing); an
// affinity key sends it to the next endpoint in the key's order. The failed
// attempt is then reported as a failure. A call is
// never retried once a response has started: the caller may already hold
// part of it.
//
// One answer is retried in the same way before the caller sees it, past
// as many endpoints as the Transport has, less one (8 to 64), rather than
// once (the answers cost the servers nothing, each retry passes over the
// endpoints met before, and the retry budget bounds them): a 404 to
// a call with a model whose body (of known length, at most 2 KiB, read by
// the transport) names the model and says it does not exist or was not
// found. That is the endpoint saying it does not serve the model (vLLM for
// a LoRA adapter it has not loaded, Ollama for a model it has not pulled)
// and having done no work. The attempt is reported with
// Outcome.NotServedModel, which counts as neither success nor failure and
// makes the Balancer pass the endpoint over for that model's calls for
// balancer.Options.NotServedMemory; its Result has FailedOver set, and
// Transport.Stats counts it with the failovers. When the call cannot go
// elsewhere, the caller gets the 404 byte for byte. Any other 404 is a
// client error, as below.
//
// A 400 that refuses the call as longer than the endpoint's context window
// for the model (vLLM's "This model's maximum context length is N
// tokens...", SGLang's alike, and TGI's, whose status is 422, and Hugging
// Face TEI's "`inputs` must have less than N tokens", whose status is 413
// up to v1.8 and 422 from v1.9; a body of known length up to 2 KiB) goes
// on the same way to an endpoint not remembered too small for it: the attempt is reported with
// Outcome.ContextWindow (neither success nor failure; the Balancer
// remembers the window), and the call's token counts become the ones the
// server gave. When no endpoint is left that might take it, the caller
// gets the refusal byte for byte. Any other 400, 413 or 422 is a client
// error, as below. A call that names no model is read so too: TEI's native
// /embed, /rerank and /predict bodies name none (its OpenAI-compatible
// /v1/embeddings does), and a server that takes calls without a model
// serves one, so their windows are remembered under a key of their own,
// apart from every named model's. (A 404 is read only for a call with a
// model: without one it says something else, such as a route the server
// lacks.)
//
// Every other 4xx but 408 (and 424, 429 above) is reported with
// Outcome.ClientError: 401 and 403 from a replica with the wrong API key,
// 404 from one without the route, 400 or 422 for a malformed call. It
// counts as neither success nor failure and gives no latency: counted as
// successes, a replica refusing every call in a millisecond, with nothing
// ever in flight, looked the fastest and drew nearly every call (298 of
// 300 in TestFast401sDrawNoTraffic); the Balancer passes over an endpoint
// whose share of such answers is far above its peers', while the
// caller's own bad calls, refused everywhere, change no choice. An error
// event with a 4xx code in a stream that began with 200 is one too. The
// outcome names the call's tenant (Outcome.Tenant, from TenantHeader), so
// a replica that refuses one tenant's calls only (its key not there yet)
// is passed over for that tenant's calls only
// (TestTenantRefusedOnOneReplica).
// A pooling call (an embedding, rerank or score call) is weighed against
// the windows remembered by its longest input, not its batch's total
// (Info.LongestInput: one text of an embeddings batch, or the longest
// query with the longest document), since a pooling server bounds each
// input by its window: a batch of a hundred short texts goes to an
// endpoint that refused one long text, and fails over to it; a refusal's
// count (vLLM's "you requested 600 tokens in the input for embedding
// generation") is the longest input's, and the batch's token estimate
// stays. So is a generation call of several sequences (n > 1, SGLang's
// sampling_params.n, a batch of prompts such as a completions prompt
// given as a list), by its longest sequence: its longest prompt with the
// output bound of one sequence (Info.LongestInput and
// Info.SequenceOutputTokens), which is what vLLM checks against
// max-model-len, whatever n; its token estimate, every sequence's, stays
// its load. A chat of a 2,000-token prompt with n = 4 and max_tokens =
// 1,000 goes to an endpoint remembered at 4,096.
//
// The outcome of a call the server answered names the call's model
// (Outcome.Model): a success, a 5xx and a 5xx error event in a stream. A
// server that serves several models can fail one while it serves the
// others (a broken LoRA adapter); the Balancer then holds those failures
// against that model on that endpoint, not the endpoint (see package
// balancer). A call that got no answer
// (a refused dial, a connection that broke) names none: that is the
// endpoint's.
//
// One such failure is not the endpoint's: net/http's "server closed idle
// connection". A model server under uvicorn (vLLM, SGLang) closes a
// keep-alive connection after 5 s idle; when net/http takes that
// connection from its pool just as the server closes it, it fails the
// request before putting a byte of it on the connection, and resends it
// by itself only for idempotent requests, so a POST comes back with that
// error. The server never saw the call, so it is sent again, once, to the
// same endpoint (which, with an affinity key, holds its prompt's cache)
// over another connection, if its body can be sent again and its context
// is live. The resend is made
// under the call's pick: to the Balancer and to OnResult it is one
// attempt, as net/http's own resend of a GET is (its Result has Resent
// set, and Transport.Stats counts the resends, so that the races can be
// counted; so are failovers); it spends no retry
// budget (it adds no load: the server gets the call once) and is made
// with DisableFailover too. A call not sent again fails, or fails over,
// blaming no endpoint. A server that read the request and then closed
// the connection (io.EOF, "transport connection broken") may have acted
// on it: that is a failure, and fails over as above. (HTTP/2 has no such
// error: net/http resends by itself what the server did not process.) The
// default Base (Options.Base nil) closes a connection idle for 4 s, before
// uvicorn does, which makes the race rare; a Base of your own does so with
// an IdleConnTimeout below the servers' keep-alive timeout. It also keeps
// up to 64 idle connections per endpoint, where net/http's
// DefaultTransport keeps 2 and re-dials every call past the second of a
// burst to one endpoint.
//
// Together, these bound what one call costs the fleet: the hops past 404s
// and past context-window refusals share one limit (they do not
// multiply), a call fails over at most once and is resent after an idle
// close at most once, so over n endpoints it makes at most
// min(max(n-1, 8), 64) + 3 attempts (18 over 16 endpoints, 67 at most;
// TestWorstCallAmplification), every one but the first and the resend
// drawn from the retry budget. A model no endpoint serves costs its first
// call one 404 from each endpoint and each later call one
// (TestTypoModelAmplification: 116 requests for 101 calls over 16); a
// flood of calls each for a model of its own costs the calls plus the
// retries the budget allows (TestMadeUpModelsFlood: 1,249 requests for
// 1,000 calls in a second, over 16). The budget is the Balancer's, shared
// with every caller, but hops past 404s draw it only down to a reserve
// kept for failover (half the floor's bank and half what the traffic
// banks): such a flood used to spend what failovers would draw on for the
// next 10 s (1,309 requests, then no failover), and leaves 40 failovers
// now. Nor do its 404s evict the not-served memory of the models the
// fleet serves (see balancer.Options.NotServedMemory).
//
// # New connections
//
// An embedding or rerank call is priced by its latency (peak-EWMA), and a
// call over a new connection waits for its setup too: a TCP dial, a TLS
// handshake, tens of milliseconds across zones. The balancer holds an
// endpoint's first answer aside for that (see scoring.State.LatencyEWMA),
// but connections are set up again later: the default Base closes one
// idle for 4 s, so an endpoint that drew no call for that long (one that
// a slow answer priced out until its EWMA decayed) answers its next call,
// the probe that brings it back, over a new connection. Counted, that
// answer was a new peak, which priced it out again for about
// LatencyDecay x ln(peak / its peers' latency), long enough to lose that
// connection too: 20 ms embeddings with a 30 ms handshake on one endpoint
// of three, and one 40 ms answer from it left it 11 calls of 120 in two
// minutes, each over a new connection (TestReconnectingEndpointKeepsItsShare;
// 37 now). So the default Base marks, per address, when it begins a dial
// (plain, or TLS when it dials TLS itself), and a call during which one to
// its endpoint began reports inferlb.Outcome.Dialed: the balancer holds its
// latency aside and counts the smaller of it and the endpoint's next
// answer's. A call sent on a warm connection while another's dial began
// is marked too; the smaller of two answers is never below what the
// endpoint's calls take, and an endpoint whose every call dials (a server
// that closes each connection) still counts every second answer, with
// its handshake, as its callers pay it. The check is two string hashes
// and an atomic load at the headers of an embedding or rerank call;
// other calls do no more than before. A Base of your own is not watched:
// net/http tells a request that its connection is new only through an
// httptrace.ClientTrace in its context, allocations on every call, and a
// middleware's dials may be anything. Nor are dials through a proxy
// (HTTP_PROXY), which are to the proxy's address.
//
// # Cost
//
// On a small chat completion over loopback (a 22-60 us call) the transport
// adds about 1-6 us per call (+4-9.4% of the median call over the runs
// in BENCH.md: the slower the machine, the higher, and by half a point
// either way with the binary's code layout), with 1 allocation (640
// bytes) beyond the bare request; with MaxPeek -1 it adds about 2.2-4.6%
// of the median call.
// Against a model server's milliseconds both are below 0.1%. On that path
// a call's cost is mostly how much code and fresh memory it touches, so:
// the call state is one
// object; a body that http.NewRequest built (in memory, with GetBody) is
// peeked by copying its head into a pooled buffer, without reading it, and
// then sent as it came; the JSON scan has no closures and little code.
// BENCH.md has the commands and figures.
//
// # Concurrency
//
// A Transport is safe for concurrent use. RoundTrip takes no lock; Pick is
// lock-free. The caller's request is never modified: each attempt sends a
// shallow copy with its own URL (and its own header map only when a header
// is added).
package httpbalancer
