package httpbalancer

import (
	"golang.org/x/net/http/httpguts"

	"cmp"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/textproto"
	"reflect"
	"strings"
	"time"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/cache"
	"github.com/inferlb/inferlb/internal/errtext"
)

// Defaults for Options. Each is what the zero value of its field means.
const (
	// DefaultMaxPeek bounds how much of a request body is read before the
	// request is sent, to find the model and prompt. 1 MiB holds a chat
	// request of about 250k tokens of English; larger bodies are still
	// forwarded whole, keyed on what the first MiB says. Their top-level
	// fields after it (model, stream, output bound, session IDs) are read
	// too when the body is in memory or replayable (GetBody), as the
	// OpenAI SDKs' bodies are; a streamed body without GetBody is routed on
	// the first MiB alone.
	DefaultMaxPeek = 1 << 20
	// MaxMaxPeek bounds MaxPeek: the peek is held in memory for the life
	// of the call.
	MaxMaxPeek = 1 << 30
	// DefaultSessionHeader names the request header whose value pins a
	// conversation to one endpoint (Keyer.Session, scoped by the body's
	// vLLM cache_salt); it beats the prompt key. It is a session
	// (inferlb.Request.Session): followed from its first call, whatever
	// the Balancer estimates of how often prompt keys recur
	// (balancer.Options.MinKeyReuse).
	DefaultSessionHeader = "X-Session-Id"
	// DefaultTenantHeader names the request header that sets Request.Tenant.
	DefaultTenantHeader = "X-Tenant-Id"
	// DefaultDiscoveryInterval is how often Discovery re-resolves its name:
	// Kubernetes' headless-service DNS answers change within that time.
	DefaultDiscoveryInterval = 30 * time.Second
	// minDiscoveryInterval bounds Discovery.Interval from below: each
	// resolution gets one interval, and DNS answers take milliseconds.
	minDiscoveryInterval = 100 * time.Millisecond
)

// Options configure a Transport. Only Endpoints (or Discovery, or a shared
// Balancer that someone else feeds) is needed; everything else has a default.
// Without any of them the Transport starts empty, for Update to fill: its
// calls fail with balancer.ErrNoEndpoints until then (see NewTransport).
type Options struct {
	// Endpoints is the initial endpoint set. An Addr is "host:port", or
	// "scheme://host[:port]" with scheme http or https (in either case;
	// without a port, the scheme's own, 80 or 443); without a scheme the
	// request URL's scheme is used. A host with neither a port nor a
	// scheme ("10.0.0.5") is refused, and so are a path, a query and user
	// information (calls keep the request's own path); a trailing "/" is
	// ignored.
	//
	// Each server is listed once. Two entries that name one server are an
	// error naming both, whatever their IDs: spellings of one host and
	// port ("10.0.0.5:8000", "http://10.0.0.5:8000/", "HTTP://10.0.0.5:8000",
	// "http://10.0.0.5" and "10.0.0.5:80"), compared with the host's case,
	// an IP address's notation and the scheme left out, and a name outside
	// ASCII as the IDNA name net/http dials ("bücher.example" is
	// "xn--bcher-kva.example"). A name is not resolved: "localhost:8000"
	// and "127.0.0.1:8000" are two servers here. As two endpoints,
	// the server would draw two shares of the calls, its load split
	// between two states that each see half of it. NewTransport makes no
	// Transport then; Update skips the later entry and applies the rest.
	// An entry that repeats an ID is an error too.
	Endpoints []inferlb.Endpoint
	// Base sends each attempt once its URL points at the picked endpoint.
	// nil means an http.Transport of the Transport's own, cloned from
	// http.DefaultTransport (its proxy, dial and TLS settings), that keeps
	// up to 64 idle connections per endpoint instead of net/http's 2 (with
	// more calls than that in flight to one endpoint, every call past the
	// second would otherwise dial anew and leave a socket in TIME_WAIT) and
	// closes a connection idle for 4 s, before the 5 s after which uvicorn
	// (vLLM, SGLang) closes it, which would race a call sent on it. Close
	// closes its idle connections. The idle connections of an endpoint that
	// left the set take no call while it is out: they close within those
	// 4 s, and the pool keeps at most 1,024 idle connections across
	// endpoints meanwhile, however fast endpoints come and go (more only
	// where http.DefaultTransport's MaxIdleConns is larger, or 0: no limit).
	// A Base of your own keeps them for its IdleConnTimeout (net/http's zero
	// value: until the server closes them), so give it one where endpoints
	// leave the set while their servers run. A program that replaced
	// http.DefaultTransport with another RoundTripper (instrumentation)
	// gets that one, as it is.
	//
	// The Transport's own Base also marks the dials it begins, per address:
	// an embedding or rerank call during which a connection to its
	// endpoint was set up (the first call after 4 s without one, the calls
	// of a burst past the idle connections) is reported with
	// inferlb.Outcome.Dialed, and the balancer holds its latency, handshake
	// and all, aside (see New connections in the package doc). A Base of
	// your own is not watched, nor are dials to a proxy (HTTP_PROXY):
	// their calls count with their connections' setup, as every call did
	// before.
	Base http.RoundTripper
	// Balancer is a Balancer to share with other adapters (a gRPC policy
	// routing to the same fleet sees the same live load). nil means the
	// Transport builds its own from BalancerOptions, which must then be the
	// only one set, and closes it in Close; a Balancer given here is the
	// caller's to close, and NewTransport refuses one already closed.
	//
	// With Endpoints (not nil: an empty list that Update fills later
	// counts) or Discovery, the Transport takes a membership of its
	// own in the shared Balancer (balancer.Membership): it routes over its own
	// endpoints only, and no other adapter's update removes them, nor its
	// updates theirs; Close ends the membership. Give the endpoints the IDs
	// the other adapter uses (grpcbalancer.WithEndpoint) so both share one
	// live state per replica: requests go to the addresses given here (a
	// replica's HTTP port) whatever address the other adapter has for the
	// same ID (its gRPC port). With neither, the Transport routes over the
	// endpoints someone else gives the Balancer's own Update, and its own
	// Update sets those; a call goes to the Addr that set's latest Update
	// gave the picked endpoint (balancer.Pick.OwnEndpoint), never to one
	// another membership (a gRPC channel, a Transport with Endpoints) gave
	// the same ID, even when that one was given later.
	Balancer *balancer.Balancer
	// BalancerOptions configure the Balancer the Transport builds when
	// Balancer is nil; the zero value is balancer.Options' documented
	// defaults. With Balancer set they must be zero (the shared Balancer
	// has its own): NewTransport returns an error otherwise, as it does for
	// options balancer.Options.Validate rejects.
	BalancerOptions balancer.Options
	// Discovery, if set, re-resolves a DNS name on an interval and serves
	// the addresses found next to Endpoints. An address found that is the
	// server of an endpoint in Endpoints, however spelled there, or whose
	// ID one has, is left to that endpoint.
	Discovery *Discovery
	// Inspector classifies requests. nil means &OpenAI{Keyer: Keyer}. With
	// an *OpenAI, a body larger than MaxPeek whose request has GetBody is
	// inspected and sent from a GetBody copy, so the model after the
	// messages is read too (see OpenAI); other Inspectors see the request
	// as the caller made it.
	Inspector Inspector
	// Keyer computes affinity keys for sessions and prompts. nil means the
	// Balancer's own (Balancer.Keyer), seeded with its AffinitySeed: then
	// processes that should agree on where a prompt or session lives set
	// the same balancer.Options.AffinitySeed (and list the same endpoint
	// IDs and weights). A Keyer given here only makes the keys; the
	// Balancer's AffinitySeed still places them on endpoints, so such
	// processes need both: Keyers of the same seed and depth
	// (cache.NewKeyer, WithDepth) and the same AffinitySeed (in
	// BalancerOptions, or the shared Balancer's). The zero Keyer
	// (new(cache.Keyer)) is refused.
	Keyer *cache.Keyer
	// MaxPeek bounds how many body bytes are read before sending, for
	// inspection, at most MaxMaxPeek. 0 means DefaultMaxPeek; negative means never read ahead
	// (routing then sees only the path and headers). Only bodies whose
	// Content-Type is absent or JSON are read ahead. A body read whole can be
	// replayed, so failover works even when the caller gave no GetBody.
	MaxPeek int
	// SessionHeader names the request header whose value names the call's
	// session, keyed by Keyer.Session as DefaultSessionHeader describes.
	// "" means DefaultSessionHeader, X-Session-Id. Its value is taken as
	// sent: a caller that forwards its users' requests
	// (httputil.ReverseProxy copies their headers) must set it from the
	// authenticated identity and drop the users' own, or a user can name
	// another user's session.
	SessionHeader string
	// TenantHeader names the request header whose value sets
	// Request.Tenant (unless the Inspector set one). "" means
	// DefaultTenantHeader, X-Tenant-Id. Its value is taken as sent, as
	// SessionHeader's is: a caller that forwards its users' requests must
	// set it from the authenticated identity and drop the users' own, or a
	// user can name another tenant's shard, or a new shard per request.
	TenantHeader string
	// LoadReports asks every endpoint for a vLLM load report per response
	// (request header endpoint-load-metrics-format: text) and publishes it
	// into the Balancer's telemetry. Reports that arrive unasked are used too.
	LoadReports bool
	// DisableFailover turns off the one retry on another endpoint for calls
	// that failed before any response arrived, and the retries past
	// endpoints that answered they do not serve the call's model (a 404)
	// or that it is longer than their context window: the caller gets
	// that answer. A call that met a
	// connection the server closed while idle, which never reached the
	// server, is still sent again to the same endpoint (see Failover in
	// the package doc).
	DisableFailover bool
	// ResponseMemory is how long the Transport remembers the affinity key
	// behind each /v1/responses response it passes, so that a follow-up
	// naming it in previous_response_id goes where its conversation is
	// cached and stored (see DefaultResponseMemory, MaxResponses). 0
	// means DefaultResponseMemory; negative turns it off. It works with the
	// default Inspector (OpenAI) only.
	ResponseMemory time.Duration
	// MaxResponses is how many /v1/responses responses the Transport
	// remembers (the table takes 64 bytes per response, rounded up to a
	// power of two, allocated on first use); the least recently used make
	// room. 0 means ResponseEntries/2 (8,192). To keep every response for
	// ResponseMemory, set it to at least the new responses per second
	// times ResponseMemory in seconds (100/s for 30 minutes: 180,000,
	// 16 MiB), with room to spare: the table is set-associative, so a
	// full set evicts before the table is full. At most MaxMaxResponses.
	MaxResponses int
	// OnResult, if set, is called once per attempt when it ends (after the
	// balancer has been told), for metrics and logs; a call sent again
	// after a connection closed while idle is one attempt. It runs on the
	// goroutine that ended the call and must be quick and safe for
	// concurrent use. A
	// panic in it goes on to that goroutine's caller (RoundTrip, or the
	// body's Read or Close), leaving no call open in the balancer; a
	// failover it interrupts is not sent.
	OnResult func(Result)
}

// Discovery re-resolves a DNS name (a Kubernetes headless service, a
// Consul name) and serves every address it returns, and for a while
// (Grace) the addresses it stops returning.
type Discovery struct {
	// Target is "host:port": the name to resolve and the port every
	// resolved address serves on, a number or a service name the system
	// knows ("http"), which the endpoints found get as its number.
	Target string
	// Scheme, "http" or "https", is given to every resolved address; ""
	// means the request URL's scheme.
	Scheme string
	// Network is the address family to serve: "ip4", "ip6", or "" (or
	// "ip") for both. In a dual-stack cluster a headless service answers
	// each pod's IPv4 and its IPv6 address, and with both each pod is two
	// endpoints, its load, keys and breaker split over two states: name
	// the family the pods serve on. Addresses are compared in canonical
	// form, so one spelt two ways is one endpoint.
	Network string
	// Interval between resolutions; 0 means DefaultDiscoveryInterval, and
	// any other value must be at least 100ms. Each lookup is also bounded
	// by it.
	Interval time.Duration
	// Grace is how long an address stays after the answers leave it out:
	// it leaves with the first answer without it that comes Grace or more
	// after the first answer without it (the ceil(Grace/Interval)-th one
	// after). Some DNS services answer a subset of the records each time
	// (a Route 53 multivalue answer holds up to 8 of the healthy records,
	// at random; a resolver may truncate a large answer), and serving each
	// answer as it came would drop live replicas and add them back at
	// every resolution, each time losing their state (load, breaker,
	// latency history), restarting their slow start and moving their
	// affinity keys. A resolver answering k of n records leaves a live
	// replica out of m answers in a row with probability (1-k/n)^m: set
	// Grace long enough that this is rare. Failed and empty answers keep
	// the set as it is and do not count.
	//
	// The addresses kept this way are at most as many as the last answer
	// has (those left out of the fewest answers first), so answers cannot
	// grow the set past twice an answer, and replicas that are gone
	// cannot outnumber those answered; a resolver answering fewer than
	// half of the records cannot have them all kept. The price is that a
	// replica that left (a deleted or unready pod) still gets calls for
	// up to Grace: if it is gone they fail, fail over and open its
	// breaker. Where an address freed meanwhile (a deleted pod's IP) may
	// go to a server of another service on the same port, keep Grace
	// short. 0 means three Intervals (90s at the default Interval);
	// negative means none: an address leaves with the first answer
	// without it.
	Grace time.Duration
	// LookupHost resolves a name; nil means net.DefaultResolver.LookupHost.
	// Tests inject a fake. It must return once ctx is done (each lookup is
	// bounded by the Interval through ctx, and Close cancels it): NewTransport
	// and Close wait for a lookup under way. It answers hosts, as
	// net.Resolver.LookupHost does: IP addresses or names, each served on
	// Target's port. An answer that is no host (empty, with a space, a '/'
	// or a port: "10.0.0.5:8000", as an adapter over SRV records might
	// give) is left out, and an answer of nothing else counts as empty.
	LookupHost func(ctx context.Context, host string) ([]string, error)
	// Labels are given to every resolved endpoint, e.g. {"model": "llama-3-8b"}.
	Labels map[string]string
	// IDByHost names each resolved endpoint by its address alone ("10.0.0.5")
	// instead of address and port, so that on a shared Balancer a gRPC
	// channel naming the same replicas by host (the policy's "idByHost")
	// shares their state although the ports differ. It assumes one replica
	// per address.
	IDByHost bool
	// OnError, if set, is told about failed or empty resolutions (the last
	// good set stays in use: a resolver hiccup must not empty the fleet)
	// and about the Balancer's complaints when a new set is applied. The
	// first resolution runs inside NewTransport, so its error reaches
	// OnError before the Transport is returned; later ones run on the
	// discovery goroutine, which Close waits for: OnError may call Update
	// then, but a Close from it (or one it waits for) never returns.
	OnError func(error)
}

// Result describes one finished attempt, for Options.OnResult.
type Result struct {
	// Endpoint is the ID of the endpoint the attempt went to.
	Endpoint string
	// Request is what inspection found.
	Request inferlb.Request
	// Status is the response status code; 0 when no response arrived.
	Status int
	// Outcome is what was reported to the balancer, but for the Latency
	// of an embedding or rerank call: the whole call here, while the
	// balancer is given the time to the response headers (the rest is the
	// caller's reading pace, not the endpoint's); and for a stream with
	// token events, the Latency and OutputTokens: the whole call and
	// every event (or the server's count that ends the stream, such as
	// a usage chunk's: see the package doc) here, while the balancer is
	// given the time to the last event, and no OutputTokens when the
	// reader set the pace or came late for the first event (see
	// TimeBetweenTokens).
	Outcome inferlb.Outcome
	// Events counts the events of an SSE (or Ollama NDJSON) stream that
	// carry tokens (0 otherwise; see the package doc).
	Events int
	// TimeBetweenTokens is the mean gap between data events of a stream
	// (0 with fewer than two) as the reader met them: a reader slower than
	// the endpoint finds them waiting, and this is its own pace; so does
	// one that started reading late, for the tokens it found buffered. The
	// balancer learns decode speed only from streams whose reader waited
	// on the endpoint and came for the first event in time (see the
	// package doc), and from the time to the last token.
	TimeBetweenTokens time.Duration
	// FailedOver is set when this attempt failed, or its endpoint answered
	// that it does not serve the call's model (Outcome.NotServedModel,
	// Status 404) or that the call is longer than its context window
	// (Outcome.ContextWindow, Status 400, 413 or 422), and the transport went on to
	// retry the call on another endpoint, which then has its own Result.
	// When no other endpoint can take the call, or the retry budget allows
	// no retry, it is not set and the call fails with this attempt's
	// error. Transport.Stats counts them (Failovers).
	FailedOver bool
	// Resent is set when the attempt was sent twice to its endpoint: the
	// first time it met a keep-alive connection the server had just
	// closed while idle, before any byte of it was sent (see Failover in
	// the package doc). Counting them tells whether a Base's
	// IdleConnTimeout is above the servers' keep-alive timeout;
	// Transport.Stats counts them (Resends).
	Resent bool
}

// config is Options with defaults applied; immutable after NewTransport.
type config struct {
	base          http.RoundTripper
	ownBase       bool       // base is defaultBase's clone, the Transport's own
	dials         *dialMarks // the own base's dials; nil for a Base of the caller's
	inspector     Inspector
	keyer         *cache.Keyer
	maxPeek       int
	sessionHeader string // canonical
	tenantHeader  string // canonical
	loadReports   bool
	failover      bool
	clock         balancer.Clock // the Balancer's: TTFT and load reports on the clock scorers compare with
	onResult      func(Result)
	chains        *responseChains // nil when ResponseMemory is off
	// reopen: the inspector is an *OpenAI, which reads past the peek of a
	// body in memory, so a large replayable body is inspected (and sent)
	// from a GetBody copy (reqBody.reopen). Other inspectors get the
	// caller's request as it came.
	reopen bool
}

// The default Base's connection pool (see Options.Base).
const (
	defaultIdleConnsPerHost = 64
	defaultIdleConns        = 1024 // in all, across endpoints
	defaultIdleConnTimeout  = 4 * time.Second
)

// defaultBase returns the Base for Options.Base nil, and whether it is the
// Transport's own; when it is, it marks its dials in d.
func defaultBase(d *dialMarks) (http.RoundTripper, bool) {
	dt, ok := http.DefaultTransport.(*http.Transport)
	if !ok {
		return http.DefaultTransport, false
	}
	t := dt.Clone()
	d.watch(t)
	t.MaxIdleConnsPerHost = max(t.MaxIdleConnsPerHost, defaultIdleConnsPerHost)
	if t.MaxIdleConns != 0 { // 0 is no limit; net/http's 100 would cap the above
		t.MaxIdleConns = max(t.MaxIdleConns, defaultIdleConns)
	}
	if t.IdleConnTimeout == 0 || t.IdleConnTimeout > defaultIdleConnTimeout {
		t.IdleConnTimeout = defaultIdleConnTimeout
	}
	return t, true
}

func bad(field, rule string, v any) error {
	return fmt.Errorf("inferlb: httpbalancer.Options.%s = %v: %s", field, v, rule)
}

// typedNil reports whether v is a nil pointer or func held in a non-nil
// interface.
func typedNil(v any) bool {
	rv := reflect.ValueOf(v)
	return rv.IsValid() && (rv.Kind() == reflect.Pointer || rv.Kind() == reflect.Func) && rv.IsNil()
}

// resolve validates o and applies the defaults, in one place.
func (o *Options) resolve() (*config, error) {
	if o.Balancer != nil && !reflect.ValueOf(o.BalancerOptions).IsZero() {
		return nil, fmt.Errorf("inferlb: httpbalancer.Options.BalancerOptions: must be zero when Balancer is set (the shared Balancer has its own)")
	}
	// Without Endpoints or Discovery nothing else would ask the Balancer
	// anything before the first call, and every call would fail.
	if o.Balancer != nil && o.Balancer.Closed() {
		return nil, rewrap("inferlb: httpbalancer.Options.Balancer: must not be closed", balancer.ErrClosed)
	}
	if o.Balancer == nil {
		if err := o.BalancerOptions.Validate(); err != nil {
			// Validate names the field as in balancer.Options; here it is
			// named as the caller wrote it, under one "inferlb: " prefix
			// (it once read "inferlb: httpbalancer.Options.BalancerOptions:
			// inferlb: balancer.Options.LoadBound = 0.5: ...").
			msg := "inferlb: httpbalancer.Options.BalancerOptions." + strings.TrimPrefix(err.Error(), "inferlb: balancer.Options.")
			return nil, errtext.Reworded(err, msg)
		}
	}
	// A nil pointer or func in the interface is not nil (a Base declared as
	// *http.Transport and left unset): taken as set, it panicked on every call.
	if typedNil(o.Base) {
		return nil, bad("Base", "must be nil (for the default) or a usable RoundTripper", fmt.Sprintf("(%T)(nil)", o.Base))
	}
	if typedNil(o.Inspector) {
		return nil, bad("Inspector", "must be nil (for the default, an *OpenAI) or a usable Inspector", fmt.Sprintf("(%T)(nil)", o.Inspector))
	}
	if o.Keyer != nil && o.Keyer.Depth() == 0 {
		// The zero Keyer (new(cache.Keyer)), which cache documents as
		// unusable: it keys on none of the prompt, with seed 0, so every
		// call of a model got one affinity key and one endpoint.
		// NewKeyer and WithDepth never make a depth of 0.
		return nil, bad("Keyer", "must be nil (for the Balancer's) or made by cache.NewKeyer: the zero Keyer is not usable", "&cache.Keyer{}")
	}
	if d := o.Discovery; d != nil {
		host, port, err := net.SplitHostPort(d.Target)
		if err != nil || host == "" || port == "" {
			return nil, bad("Discovery.Target", `must be "host:port"`, fmt.Sprintf("%q", d.Target))
		}
		if n, err := net.LookupPort("tcp", port); err != nil || n == 0 {
			// A number, or a service name the system knows ("http").
			return nil, bad("Discovery.Target", "must have a port number (1-65535) or a known service name", fmt.Sprintf("%q", d.Target))
		}
		if d.Scheme != "" && d.Scheme != "http" && d.Scheme != "https" {
			return nil, bad("Discovery.Scheme", `must be "", "http" or "https"`, fmt.Sprintf("%q", d.Scheme))
		}
		if d.Interval < 0 || d.Interval > 0 && d.Interval < minDiscoveryInterval {
			return nil, bad("Discovery.Interval", "must be 0 (the default) or at least 100ms", d.Interval)
		}
		if d.Network != "" && d.Network != "ip" && d.Network != "ip4" && d.Network != "ip6" {
			return nil, bad("Discovery.Network", `must be "", "ip", "ip4" or "ip6"`, fmt.Sprintf("%q", d.Network))
		}
	}
	if o.MaxResponses < 0 || o.MaxResponses > MaxMaxResponses {
		return nil, bad("MaxResponses", "must be between 0 (the default) and MaxMaxResponses (4 Mi)", o.MaxResponses)
	}
	if o.MaxPeek > MaxMaxPeek {
		return nil, bad("MaxPeek", "must be at most MaxMaxPeek (1 GiB)", o.MaxPeek)
	}
	for _, h := range []struct{ field, v string }{{"SessionHeader", o.SessionHeader}, {"TenantHeader", o.TenantHeader}} {
		if h.v != "" && !httpguts.ValidHeaderFieldName(h.v) {
			return nil, bad(h.field, "must be a header name (letters, digits and !#$%&'*+-.^_`|~)", fmt.Sprintf("%q", h.v))
		}
	}
	c := &config{
		base:          o.Base,
		inspector:     o.Inspector,
		keyer:         o.Keyer,
		maxPeek:       o.MaxPeek,
		sessionHeader: textproto.CanonicalMIMEHeaderKey(cmp.Or(o.SessionHeader, DefaultSessionHeader)),
		tenantHeader:  textproto.CanonicalMIMEHeaderKey(cmp.Or(o.TenantHeader, DefaultTenantHeader)),
		loadReports:   o.LoadReports,
		failover:      !o.DisableFailover,
		onResult:      o.OnResult,
	}
	if c.base == nil {
		c.dials = newDialMarks()
		if c.base, c.ownBase = defaultBase(c.dials); !c.ownBase {
			c.dials = nil
		}
	}
	if o.ResponseMemory >= 0 {
		c.chains = &responseChains{ttl: cmp.Or(o.ResponseMemory, DefaultResponseMemory), entries: 2 * o.MaxResponses}
	}
	if c.maxPeek == 0 {
		c.maxPeek = DefaultMaxPeek
	}
	return c, nil
}

// bind fills the defaults that come from the Balancer.
func (c *config) bind(b *balancer.Balancer) {
	c.clock = b
	if c.dials != nil {
		c.dials.clock = b
	}
	if c.keyer == nil {
		c.keyer = b.Keyer()
	}
	if c.chains != nil {
		c.chains.clock = b
	}
	if c.inspector == nil {
		c.inspector = &OpenAI{Keyer: c.keyer, chains: c.chains}
	} else {
		c.chains = nil // only the default Inspector reads previous_response_id
	}
	_, c.reopen = c.inspector.(*OpenAI)
}

// rewrap is fmt.Errorf("%s: %w", msg, err) with err's own "inferlb: "
// prefix dropped, so that the message has one.
func rewrap(msg string, err error) error {
	return errtext.Reworded(err, msg+": "+strings.TrimPrefix(err.Error(), "inferlb: "))
}
