// Package grpcbalancer is inferlb's gRPC load-balancing policy: grpc-go
// routes each call with the shared P2C core (package balancer), which knows
// per-endpoint load, latency, errors, standing and ORCA telemetry.
//
// Importing the package registers the policy as Name ("inferlb"):
//
//	import "github.com/inferlb/inferlb/balancer/grpcbalancer"
//
//	conn, err := grpc.NewClient("dns:///llm.internal:50051",
//		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"inferlb":{
//			"methods": {"/pkg.Gen/": "llm", "/pkg.Embed/Embed": "embedding"},
//			"affinityKeyHeader": "x-session-id"}}]}`),
//		grpc.WithChainUnaryInterceptor(grpcbalancer.UnaryOutcome(), // or UnaryRetry(2)
//			grpcbalancer.UnaryEstimate(nil)), // optional: prompt tokens from the message
//		grpc.WithTransportCredentials(creds))
//
// Install UnaryOutcome or UnaryRetry on every channel that uses the policy:
// without one, grpc-go reports to the policy as a success a unary call that
// the server refused before reading it (a long prompt rejected by a rate
// limiter or a proxy's 429): the overload is counted as a success, and for
// services scored on latency (embeddings, rerankers) as a fast one.
//
// Each channel then gets a Balancer of its own, which nothing outside the
// channel can reach: it learns load from its calls and ORCA reports only,
// and no metrics.Collector can export it. To route a channel on a
// telemetry.Poller's samples (modelserver, dcgm, promapi; keyed by the
// endpoint IDs below), to export its view, or to share one live view of load
// between gRPC channels and HTTP traffic (balancer/httpbalancer), build the
// policy around a Balancer of your own with NewBuilder and register it under
// a name of your own. Each channel then takes its own membership in that
// Balancer (balancer.Membership): it routes over its own resolver's
// endpoints and READY children only, and shares the live state of the
// endpoints it has in common with the others, by ID.
//
// # Structure
//
// The policy follows grpc-go's modern recipe for endpoint-level policies
// (gRFC A61, as least_request of gRFC A48 does): endpointsharding with one
// pickfirst child per resolver endpoint, pickfirst's health listener on so
// a child is READY only when healthy. gRPC checks health only when the
// channel's service config asks for it ("healthCheckConfig": {"serviceName":
// ""} beside "loadBalancingConfig", with google.golang.org/grpc/health linked
// in); without it a server that reports NOT_SERVING stays READY and takes
// calls (TestE2EHealthNeedsHealthCheckConfig). The core holds one endpoint per
// resolver endpoint, keyed by the smallest of its addresses (or the ID
// given with WithEndpoint); its state survives picker rebuilds because the policy calls
// its membership's Update only when the endpoint set changes and SetReady
// when a child's connectivity changes, before it publishes the next picker.
// An endpoint listing the same addresses as one before it in the update
// (in any order) is left out: the first listed counts, its ID and labels
// too, as endpointsharding keeps one child per set of addresses.
// A child that lost its connection and reconnected without passing through
// TRANSIENT_FAILURE (the server closed it gracefully, as its
// MaxConnectionAge does) is the same warm server: it comes back without
// slow start (Membership.SetReconnected); after a failure it ramps.
// An endpoint the resolver stops listing leaves the channel's membership
// (and the core, with its state, unless another membership lists it), and
// the policy forgets it: its address, readiness and connection history
// and, once gRPC reports them shut down, its SubConns, so pods replaced at
// new addresses on every rollout leave the policy holding the current
// endpoints only. An address listed again later is a new endpoint: its
// first READY is a first connection, not a reconnect.
//
// Connectivity: the channel is READY while any child is READY, and calls go
// through the core over the READY children. Otherwise the policy reports
// endpointsharding's aggregate (CONNECTING if any child connects, then IDLE,
// then TRANSIENT_FAILURE) and its picker: calls queue while children
// connect, IDLE children are woken, and in TRANSIENT_FAILURE non
// wait-for-ready calls fail UNAVAILABLE with the last connection error.
// A resolver update without endpoints is taken for a resolver error (the
// policy returns balancer.ErrBadResolverState, so gRPC resolves again):
// after endpoints, the channel keeps them, their connections and their live
// state, as the HTTP transport's discovery keeps its last set (a DNS answer
// without records for a moment would otherwise drop every connection and
// reset breakers and slow start); before any, calls fail with it. grpc-go's
// own pick_first and round_robin (v1.85) close their connections on such an
// update instead: a fleet scaled to zero fails fast there, and here through
// the breakers of the endpoints it keeps.
// When children are READY but the core may pick none of them (all cooling
// down, ejected or tripped, with panic routing off), non wait-for-ready
// calls fail UNAVAILABLE at once, with a message that says so (for a call
// that names a model: that no READY endpoint may serve it, or each that may
// is excluded; a model that no endpoint lists at all, READY or not, fails
// with core.ErrModelNotListed and its name), and wait-for-ready calls wait: the policy publishes its
// picker again when the earliest exclusion ends (within 10 ms to 1 s), and
// they go through then.
//
// Calls queued while a new channel connects go, as with round_robin, to the
// children READY when the first one is, which may be that one alone (six
// long calls sent at once on a fresh channel to three local servers all
// went to one in two runs of four). A call that gRPC picks for on the
// picker from before a child turned READY, and that the core gives that
// child's endpoint, waits for the picker that holds it (a moment) rather
// than going elsewhere: an affinity key whose owner has just connected
// keeps its calls there.
// Before a burst of long generations, connect the channel ahead of time
// (ClientConn.Connect: a channel starts IDLE) and let its children connect.
//
// # Request facts
//
// The picker reads a call's Request from inferlb.FromContext first (set it
// with inferlb.NewContext; its Service is filled from the method when
// unset). Otherwise it builds one: Service from the method (see "methods"),
// AffinityKey from the affinityKeyHeader value (the Balancer's
// Keyer().Session of the first value, marked as a session,
// inferlb.Request.Session, so it is followed whatever the Balancer
// estimates of how often prompt keys recur: balancer.Options.MinKeyReuse),
// Tenant and Model from tenantHeader and modelHeader. A pick
// allocates nothing when the facts come from the method or the context,
// and one small value per configured header present (grpc-go copies
// metadata values out of the context).
//
// grpc-go's picker does not see a call's message, so the policy knows a
// call's tokens (PromptTokens, MaxOutputTokens: in-flight tokens, the
// prefill weighed between two candidates, the data-parallel barrier of
// dp_group ranks, the context-window check) only from a Request in the
// context, or from UnaryEstimate and StreamEstimate: interceptors that
// estimate them from the request message before the pick, by default
// its protobuf size / 4 (SizeEstimate; about 25% low for prompts of
// packed token IDs, 3 bytes each for most IDs of a 100k+ vocabulary;
// give your own TokenEstimator for such protos). The estimate fills only
// the counts the call's facts leave 0: a Request in the context keeps
// its fields, and metadata facts stay. StreamEstimate serves
// server-streaming calls, whose pick it moves to their first SendMsg.
//
// # Outcomes
//
// When a call ends, its gRPC status becomes the core's Outcome: codes that
// Envoy maps to 5xx (UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL,
// UNAVAILABLE, DATA_LOSS) are failures; RESOURCE_EXHAUSTED is an overload
// answer that cools the endpoint down for the trailer's
// grpc-retry-pushback-ms or retry-after, else the retry delay of a
// google.rpc.RetryInfo in the status details (but not one that says a message
// is over a size limit: that is the message's doing, and counts as a
// success when the endpoint answered, else as nothing), and so is an HTTP
// 429 from a proxy that does not speak gRPC (UNAVAILABLE to gRPC; it
// cools the endpoint down for DefaultCooldown), and so is an UNAVAILABLE
// whose trailer carries grpc-retry-pushback-ms or retry-after, or whose
// status carries a google.rpc.RetryInfo (the server
// throttling the client, as gRFC A6 has servers do: the endpoint cools
// down for that pushback, or for DefaultCooldown when the value gives
// none), and the UNAVAILABLE Triton sheds load with ("Exceeds maximum queue size", "Request timeout
// expired": its queue is full or a request waited past the queue
// policy's timeout; DefaultCooldown too); a NOT_FOUND or UNAVAILABLE
// "Request for unknown model" (Triton without that model loaded) says the
// endpoint does not serve the call's model: with the model known (the
// modelHeader, or the inferlb.Request in the context) it is reported as
// Outcome.NotServedModel, and the Balancer passes the endpoint over for
// that model's calls for NotServedMemory; without it, it counts as neither
// success nor failure; an INVALID_ARGUMENT, OUT_OF_RANGE,
// FAILED_PRECONDITION, INTERNAL or UNKNOWN the server sent with a refusal
// of the call as longer than its context window (vLLM's, SGLang's, TGI's
// or TensorRT-LLM's text: "This model's maximum context length is N
// tokens", "Prompt length (N) exceeds maximum sequence length (M)") is
// neither either: it is reported as Outcome.ContextWindow, and the
// Balancer remembers the window for the call's model (for a call without
// one, such as TEI's tei.v1 API makes, under a key of its own) and passes
// the endpoint over for calls whose tokens (the inferlb.Request's PromptTokens and
// MaxOutputTokens, which UnaryEstimate estimates; a pooling call's LongestInput, a call of several
// sequences' LongestInput + SequenceOutputTokens, which the policy does not
// estimate: set them in the Request of the call's context) do not fit it, while UnaryRetry sends the call on with
// the token counts the server gave (a pooling call's as its LongestInput), or, when no endpoint's window might
// take it, ends it with the server's refusal as sent (a refusal is
// believed only of a call whose request message, which UnaryRetry,
// UnaryOutcome and StreamTiming see, carries no such text itself: Triton
// copies an input's name and the request's id into its errors, and a
// caller could otherwise have any window it likes remembered; a call
// without them is believed unchecked); a success, and an INTERNAL, UNKNOWN, DATA_LOSS or
// UNIMPLEMENTED the server sent (some of its answer arrived), or an error
// in a stream's message, names the call's model when it is known
// (Outcome.Model), so that a model failing on a Triton server that serves
// others (its backend crashed) is held against that model there, not the
// server; UNAVAILABLE and DEADLINE_EXCEEDED never do, as grpc-go reports a
// broken connection and a deadline with them; CANCELLED is the
// client's doing and counts as neither (when the call's context was
// cancelled with nothing received from the server, BytesReceived false, it
// is reported Unanswered: the balancer reads an embedding's or rerank's
// wait as a lower bound on the endpoint's latency, and a generation's, as
// long as its answers take, towards a run that prices a hung replica up
// (scoring.State.Abandoned); grpc-go counts a stream's headers as bytes
// received, and a server sends them at once, before any token, also when
// its engine hangs, so a server stream whose headers came is reported
// Unanswered through StreamTiming when its caller gave up in a RecvMsg
// that waited for its first message, and is not without StreamTiming,
// nor when the caller was away from the stream (a message may have been
// waiting unread); a unary generation call (the llm service) whose
// server sent its headers before its answer (grpc.SendHeader) is
// reported Unanswered through UnaryOutcome or UnaryRetry when no
// response message had arrived (its reply message is still empty), and
// is not without them, nor for other services; an attempt that an
// interceptor chained inside them cancelled while the call's caller
// still waited counts as the caller's cancel when no other attempt of
// the invoke was in flight at any time during it (a per-attempt timeout
// built on context.WithCancel and a timer: its reply is read as the
// interceptor returns, or, when the interceptor tries again, it is
// reported Unanswered as the retry is picked; gRPC's own retries within
// the attempt, transparent or by a retry policy, end each try before
// they pick the next, and do not count), and is reported as it ends,
// answered, when it overlapped another attempt (a hedge's loser); an
// attempt that ends after the invoke that picked it returned (one such
// an interceptor left running) is reported as it ends, as grpc-go ended
// it, and never settled against a later invoke of UnaryRetry's, nor
// counted in its decision to retry that one (bytes it received, a
// refusal or not-served answer it got); a CANCEL reset while
// the caller still waits is not); the codes that map to 4xx
// (INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE, UNAUTHENTICATED,
// PERMISSION_DENIED, another NOT_FOUND, ALREADY_EXISTS, ABORTED) describe
// the request and are client errors (Outcome.ClientError): neither success
// nor failure, no latency, and the Balancer passes over an endpoint whose
// share of them is far above its peers' (a replica with the wrong API key
// answering every call UNAUTHENTICATED at once, which as a success looked
// the fastest of all and drew 299 of 300 calls in
// TestE2EFastUnauthenticatedDrawsNoTraffic). The outcome names the call's
// tenant (Outcome.Tenant, from tenantHeader or the inferlb.Request in the
// context), so a server that refuses one tenant's calls only is passed over
// for that tenant's calls only (TestE2ETenantRefusedOnOneServer,
// both ways). A pick whose call was never sent counts as nothing,
// and so does a request the client could not encode (an INTERNAL "error
// while marshaling" or "compressing" before any answer: a proto3 string
// that is not UTF-8, say), and an answer the client could not unmarshal
// (a client built from another version of the .proto than its servers:
// as failures, such answers tripped every endpoint's breaker in turn).
// An attempt the server did not process (a stream refused with
// REFUSED_STREAM, or dropped by a graceful GOAWAY: MaxConnectionAge, a
// rolling restart, a draining sidecar) is an overload answer without a
// hint, not a failure: the endpoint cools down for the Balancer's
// DefaultCooldown (1s unless set), so gRPC's transparent retry of the call
// goes elsewhere, and connection rotations do not add to its error rate or
// trip its breaker. A GOAWAY's stream is no refusal, though
// (inferlb.Outcome.Drained): it never puts the endpoint on the probation
// that follows overload answers in a row, so a replica restarted behind a
// draining listener takes its share of calls once it is back.
// With StreamTiming, a DEADLINE_EXCEEDED that ends a stream after its first
// token counts as neither too: a long generation outlasting the caller's
// time budget says nothing about the endpoint, and counted as failures such
// deadlines would trip healthy endpoints' breakers; before the first token
// it is a failure.
// Latency is measured by the core from pick to Done.
//
// # Failover
//
// gRPC's transparent retry re-sends calls that never left the client or
// that the server did not process (see Outcomes). A
// call the server accepted but never answered (its connection died, as when
// a backend is killed) fails UNAVAILABLE; install UnaryRetry to send such
// calls to another endpoint, within the Balancer's retry budget
// (Balancer.AllowRetry), so failover cannot storm a degraded fleet. With a
// retryPolicy in the service config, UnaryRetry also steers gRPC's own
// retries of a call away from the endpoint it failed on, and counts them
// toward its attempts.
//
// UnaryRetry, or UnaryOutcome where calls must not be retried, also gives
// the policy each unary call's own error: grpc-go reports a call the server
// failed before the client had written its request as a success (a long
// prompt over HTTP/2's 64 KiB initial window that a rate limiter rejects
// unread; see Outcomes), and through either interceptor it counts as the
// overload or failure it was. StreamTiming (see Token streams) does the
// same for streams of every kind (it times only those the server streams).
//
// # Token streams
//
// Install StreamTiming (grpc.WithChainStreamInterceptor) on channels whose
// server streams carry generated tokens (Triton's decoupled models, for
// one): each stream's first token and output token count then reach the
// core with its outcome, so it learns each endpoint's time to first token
// and decode speed, and P2C sends fewer generations to a slower decoder,
// as it does for the HTTP transport's SSE streams. Decode speed runs to the
// last token, not to the stream's end, and comes only from streams whose
// application waited in RecvMsg for the tokens: one that spends longer on
// each message than the server takes to send one finds them already
// received, and their spacing is its own pace. Time to first token, and
// decode speed with it, is likewise unknown when the application comes to
// receive late after sending the request (its time away, not waiting in
// Header or RecvMsg, over 1/8 of the time to the first token) and the
// RecvMsg that delivers the first token returns at once: the token was
// already received, at a time nobody can tell.
//
// Some servers report a request's failure in a response message and end
// the stream OK: Triton's decoupled models (ModelStreamInfer, how
// TensorRT-LLM streams are served) send a message whose error_message is
// set, its load shedding too ("Exceeds maximum queue size"). Install
// StreamTimingWith with StreamOptions.Error returning that error, and the
// first such message makes the stream's outcome: an overload answer for
// Triton's load shedding, a refusal as too long (Outcome.ContextWindow,
// see Outcomes) for a context-window refusal's text, the error's own
// class for a gRPC status, the endpoint's failure otherwise, whether the
// stream then ends OK or the application cancels it at the error.
// Without it such a stream counts as a success, and a replica failing
// every request looks like the fastest.
//
// StreamTiming also gives the policy each stream's own end: a stream the
// server failed before the client had written its request, which grpc-go
// reports as a success (see Failover), counts as the status gRPC ends the
// stream with, the error the application's RecvMsg returns (an overload
// for RESOURCE_EXHAUSTED), also when the application reads only Header
// and leaves, or as neither when the application leaves the stream before
// gRPC has read its end (its context ends first).
//
// # ORCA load reports
//
// Per-call ORCA reports (gRFC A51: DoneInfo.ServerLoad, from the trailer)
// and, when enabled, out-of-band reports (an ORCA stream per READY
// SubConn) are published to the core's telemetry store for the endpoint:
// cpu_utilization becomes CPUUtil, application_utilization AppUtil, and the
// named metrics (or named utilizations) kv_cache_usage, kv_cache_usage_perc,
// kv_cache_utilization and gpu_cache_usage_perc KVCacheUsage (a 0..1
// fraction), num_requests_waiting and queue_depth Waiting,
// num_requests_running Running, prefix_cache_hit_rate PrefixCacheHitRate
// (of two names of one field in a report, the larger value counts).
// Servers send them with google.golang.org/grpc/orca: per-call reports
// through orca.CallMetricsServerOption and, in a handler,
// orca.CallMetricsRecorderFromContext; out-of-band ones through
// orca.Register's ORCA service (see Example (OrcaServer)).
// Utilizations of 0 read as "not reported" (proto3 has no presence), as in
// weighted round robin (gRFC A58). The built-in LLM scorer prices
// AppUtil, not CPUUtil, and does not fall back to CPU as A58's weights do:
// an inference server's bottleneck is its GPU, and the CPU its HTTP and
// tokenizer threads use says little about it. CPUUtil is there for a
// custom Scorer (balancer.Options.Scorers); a server that measures its
// own load reports it as application_utilization.
// A value no server measures (NaN, an infinity, a negative utilization or
// count, a fraction above 1) is dropped, and a report left with nothing is
// counted as malformed telemetry (telemetry.StoreStats.DroppedEmpty of the
// Balancer's Store), as the HTTP transport counts an unreadable load header.
// When an endpoint the channel had connected to connects again (the server
// may have restarted), the process's load fields observed before
// (telemetry.ProcessLoad: queue, KV and prefix cache, utilization, GPU
// memory used, LoRA adapters, sleep state) are expired (telemetry.Store.Expire),
// whoever published them, as
// weighted round robin forgets its weights: the old process's last report
// would otherwise price the new one until it aged out (telemetryMaxAge).
// A reconnect cannot tell a new process from the same one: a server's
// MaxConnectionAge (a graceful GOAWAY, then the same process) expires them
// too (TestMaxConnectionAgeReconnectExpiresAPollerReading). A
// telemetry.Poller publishing into the Balancer is woken by the expiry and
// scrapes again, at once or PollerOptions.MinInterval (default a quarter
// of its Interval) after its last round started, plus up to Jitter of
// MinInterval: the endpoint goes without scraped readings for about one
// scrape, not until the Poller's next round
// (TestMaxConnectionAgeReconnectPollsAgainEarly). A failed connection
// attempt between the two READYs would mark most restarts, but not one
// whose new process takes the listening socket over, which reconnects as a
// rotation does; the old process's report is the worse error, so every
// reconnect expires.
//
// # Service config
//
// The policy's config object, every field optional (the // comments are
// notes for the reader: JSON has no comments, and Builder.ParseConfig
// refuses them):
//
//	{
//	  "methods": {                      // method or service -> Service kind
//	    "/pkg.Svc/Embed": "embedding",  //   exact method
//	    "/pkg.Svc/": "llm"              //   every method of a service (no wildcards: "/pkg.Svc/*" is refused)
//	  },
//	  "defaultService": "unknown",      // for unlisted methods; default "unknown"
//	  "affinityKeyHeader": "",          // metadata key of a session/affinity value; default none
//	  "tenantHeader": "",               // metadata key of the tenant; default none
//	  "modelHeader": "",                // metadata key of the model name; default none
//	  "idByHost": false,                // name endpoints by host, not host:port (see below); default false
//	  "endpoints": {                    // what each address serves, for resolvers that give addresses only (see below); default none
//	    "10.0.0.5:50051": {"id": "gpu-5", "weight": 2, "labels": {"model": "llama,llama-lora-sql"}}
//	  },
//	  "orca": {
//	    "perCall": true,                // read per-call reports; default true
//	    "outOfBand": false,             // run an ORCA stream per READY SubConn; default false
//	    "interval": "10s"               // requested OOB interval; read only with outOfBand true (kept, unchecked, while it is off); default 10s; at most telemetryMaxAge (a NewBuilder Balancer's own)
//	  },
//	  "balancer": {                     // balancer.Options; 0 or absent = the core's default
//	    "telemetryMaxAge": "30s", "latencyDecay": "10s", "errorAlpha": 0.1,
//	    "errorDecay": "30s", "panicThreshold": 0.5, "defaultCooldown": "1s",
//	    "maxCooldown": "30s", "slowStartWindow": "30s", "slowStartMinWeight": 0.1,
//	    "slowStartAggression": 1, "retryRatio": 0.2, "retryFloor": 10,
//	    "affinity": "prefer",           // "prefer", "strict" (first within its load bound) or "off" (no affinity)
//	    "loadBound": 1.25, "affinitySeed": 0,
//	    "tenantShardSize": 0,           // > 0: each tenant (tenantHeader) on its own shard of endpoints
//	    "tenantShardStrict": false,     // true: a tenant's calls fail rather than leave its shard
//	    "spillMemory": "45s",           // how long a spilled key's endpoint counts as warm; negative: off
//	    "minKeyReuse": 0.05,            // prompt-key affinity only while this share recurs (sessions always); negative: always
//	    "adapterHomes": 1,              // a LoRA adapter with at most this many fair shares of calls in flight goes home; negative: off
//	    "scanLimit": 32,                // embeddings and rerankers compare up to this many endpoints per pick; negative: two choices
//	    "stickyTTL": "0s",              // > 0: follow a key, per model, to where it last went (opt-in)
//	    "notServedMemory": "30s",       // pass over an endpoint that said it lacks the call's model; negative: off
//	    "stickyEntries": 0,             // bound of that table; 0: cache.DefaultMaxSessions; at most MaxConfigStickyEntries
//	    "breakerFailures": 5, "breakerProbes": 3, "ejectionTime": "10s",
//	    "maxEjectionTime": "2m", "maxEjectedFraction": 0.5,
//	    "outlierInterval": "10s", "outlierMinRequests": 20,
//	    "outlierMargin": 0.2, "subsetLabel": "model",
//	    "dpGroupLabel": "dp_group"      // label naming a rank's data-parallel engine; not subsetLabel's
//	  }
//	}
//
// Service names are those inferlb.ParseService accepts. Header keys are
// case-insensitive metadata keys and may not start with "grpc-". Durations
// are Go or protobuf-JSON durations ("1.5s", "250ms"); an empty string is
// the field left out. Field names match in any case, as encoding/json
// matches them ("ModelHeader" is modelHeader). A "balancer" tunable's range,
// and what 0 or a negative value means (often: that feature off), are those
// of the balancer.Options field of the same name. The config is
// parsed and validated once, by Builder.ParseConfig: an unknown field, a key
// given twice in one object (a field, in any case, or a method), a value
// of the wrong type, a bad method pattern, a bad header or a tunable that
// balancer.Options.Validate rejects fails with an error that starts with
// "inferlb: " and names the field. Changing the "balancer" section of a
// running channel replaces its Balancer (live state starts over); the
// "balancer" section is refused for a NewBuilder policy, whose Balancer the
// caller configured; its "orca.interval" is held to that Balancer's
// TelemetryMaxAge instead.
//
// Endpoints are named by their address ("10.0.0.5:8001") unless the
// resolver gives an ID with WithEndpoint; an endpoint with several
// addresses by the smallest (as a string), so that the resolver may list
// them in any order without the endpoint's live state starting over. With
// "idByHost" they are named by that address's host alone ("10.0.0.5"), so that on a shared Balancer (NewBuilder) an
// HTTP transport that names the same replicas by host (Endpoint.ID, or
// Discovery.IDByHost) shares their state although the ports differ, with
// the stock DNS resolver and no WithEndpoint. It assumes one replica per
// host: two endpoints on one host would be one to the Balancer.
//
// "endpoints" describes endpoints by address for resolvers that say
// nothing else (dns:///, passthrough:///), as WithEndpoint does in a custom
// resolver: each entry, keyed by an address as the resolver gives it
// (host:port), has the endpoint's "id" (default: its address, or host with
// idByHost), "weight" (relative capacity; 0 or absent means 1) and
// "labels" ("model": the models served, comma-separated, LoRA adapters and
// version names included; "dp_group"; any other label a custom Scorer
// reads). It is a static map, so it fits addresses that stay (static IPs
// from DNS, a name dialed through passthrough); pods whose IPs change need
// a resolver that describes them (WithEndpoint). An address matches however either side writes it: an
// IP address in any notation, a name in any case, a port with leading
// zeros. An endpoint with several addresses takes the entry of the
// smallest that has one; an address without an entry keeps the defaults;
// an entry whose address the resolver does not give is unused. An endpoint
// the resolver describes with WithEndpoint keeps that description whole,
// none of the entry's fields mixed in: the resolver speaks for the
// endpoint as it is at each update, the entry was written ahead for
// resolvers that cannot. The entries apply at every resolver update and
// config change, never on a call's path. An address that is not
// host:port with a port from 1 to 65535, two entries for one address
// (also spelt differently), a weight that is negative or above
// balancer.MaxWeight, an ID or a label name with an ASCII control
// character (U+0000 to U+001F, DEL), a label without a name, a label
// value that is not a string, more than MaxConfigEndpoints entries or
// more than MaxConfigLabels labels in one fails the parse, naming the
// entry and the field (endpoints["10.0.0.5:50051"].weight,
// endpoints["10.0.0.5:50051"].labels["model"]). Two entries that give one
// "id" are accepted, as two addresses of one server may be (its IPv4 and
// IPv6 addresses, say): they name one endpoint, whose state and load
// reports both addresses share, and the Balancer keeps one of them in its
// set at each update (grpclog warns "duplicate ID" of the other), so give
// each replica its own ID. Label values are free
// text, as balancer.Balancer.Update takes them (each name in "model" is
// trimmed of the spaces around it), and an ID or a label has no length
// limit of its own, as in Update: the config's size bounds them.
//
// Affinity keys are hashed with the Balancer's own Keyer (Balancer.Keyer),
// which shares its AffinitySeed with the consistent placement. With an
// explicit balancer.affinitySeed every process places a session on the
// same endpoint; the random default (0) keeps placement unpredictable from
// outside the process. The seed is a secret only where the service config
// is: one served by the resolver (a DNS TXT record, xDS) is readable by
// anyone who can resolve the name, and with it anyone can compute which
// prompts land on one endpoint. Give a seed through
// grpc.WithDefaultServiceConfig from the caller's own secret configuration,
// or set it on a shared Balancer (NewBuilder, balancer.Options.AffinitySeed),
// and leave it out of a config the resolver serves.
package grpcbalancer
