package grpcbalancer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	v3orcapb "github.com/cncf/xds/go/xds/data/orca/v3"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
)

// maxRepicks bounds how often one Pick asks the core again after it chose an
// endpoint this picker has no READY child for.
const maxRepicks = 2

// picker routes a channel's calls with the core's P2C over the READY
// children, then lets the chosen child (a pickfirst picker) name the SubConn.
//
// Concurrency: immutable after construction; gRPC calls Pick from any
// goroutine. The core's state is shared and atomic.
type picker struct {
	lb       *lbBalancer      // to publish this picker again (wakeLater)
	mem      *core.Membership // the channel's membership in its Balancer
	cfg      *lbConfig
	children childTable // READY children
	excluded error      // why the core picks none of them; see noEndpoint
	gen      uint64     // lb.gen when built
	// stale: built from endpointsharding's view from before the last
	// resolver update (see lbBalancer.UpdateState), whose own view is on
	// its way: a pick the core refuses waits for it, as one on a picker
	// older than lb.gen does.
	stale bool
}

// excludedError says why the core found nothing to pick among n READY
// children: each is out of rotation. It wraps core.ErrNoEndpoints.
func excludedError(n int) error {
	what := fmt.Sprintf("each of the %d READY endpoints is", n)
	if n == 1 {
		what = "the one READY endpoint is"
	}
	return fmt.Errorf("%w: %s excluded (breaker open or probing, cooling down after RESOURCE_EXHAUSTED, or ejected as an outlier)", core.ErrNoEndpoints, what)
}

// noEndpoint is the error of a pick the core refused: gRPC fails a call
// that does not wait for ready UNAVAILABLE with its message, and shows it
// as the "latest balancer error" of one that waits until its deadline.
// When the call names a model, the READY endpoints may also just not serve
// it.
func (p *picker) noEndpoint(req *inferlb.Request, err error) error {
	if errors.Is(err, core.ErrModelNotListed) {
		// No endpoint lists it, READY or not: a typo, or a call for
		// another fleet, which waiting will not mend.
		return fmt.Errorf("%w: %s (check the name against the endpoints' model labels)", err, quoteModel(req.Model))
	}
	if !errors.Is(err, core.ErrNoEndpoints) || p.excluded == nil || errors.Is(err, core.ErrTenantShardDown) {
		return err
	}
	if req.Model != "" {
		return fmt.Errorf("%w for model %s: no READY endpoint may serve it, or each that may is excluded (breaker open or probing, cooling down after RESOURCE_EXHAUSTED, or ejected as an outlier)", core.ErrNoEndpoints, quoteModel(req.Model))
	}
	return p.excluded
}

// errBalancerClosed fails every call, wait-for-ready ones too, once the
// Balancer the policy routes with is closed: a status error, which gRPC
// does not wait out. It can only be a caller's Balancer (NewBuilder)
// closed while a channel still uses it: the policy's own is replaced, not
// closed, while the channel lives.
var errBalancerClosed = statusError{codes.Unavailable, fmt.Errorf("%w: this channel routes with it (a NewBuilder Balancer must outlive the channels that use it)", core.ErrClosed)}

// maxQuotedModel bounds how much of a model name an error quotes: the name
// is request data (a metadata header of up to gRPC's header limit), and the
// error goes to the caller's logs and perhaps back to its own client.
const maxQuotedModel = 256

// quoteModel quotes at most maxQuotedModel bytes of a model name.
func quoteModel(m string) string {
	if len(m) <= maxQuotedModel {
		return strconv.Quote(m)
	}
	return fmt.Sprintf("%q... (%d bytes)", m[:maxQuotedModel], len(m))
}

// childTable finds a READY child by the core's pick: by the endpoint's
// serial (an index, no hashing) when the serials are dense enough, else by
// ID. Immutable.
type childTable struct {
	base     uint64            // serial of bySerial[0]
	bySerial []balancer.Picker // nil entries: not READY here
	byID     map[string]balancer.Picker
}

// maxSparse bounds bySerial at this many slots per child, so endpoint
// churn (serials are never reused) cannot make a picker's table large.
const maxSparse = 4

func newChildTable(b *core.Balancer, byID map[string]balancer.Picker) childTable {
	t := childTable{byID: byID}
	lo, hi := uint64(0), uint64(0)
	serials := make(map[string]uint64, len(byID))
	for id := range byID {
		s, ok := b.Serial(id)
		if !ok {
			continue
		}
		serials[id] = s
		if lo == 0 || s < lo {
			lo = s
		}
		hi = max(hi, s)
	}
	if lo == 0 || hi-lo+1 > uint64(maxSparse*len(byID)+8) {
		return t
	}
	t.base = lo
	t.bySerial = make([]balancer.Picker, hi-lo+1)
	for id, s := range serials {
		t.bySerial[s-lo] = byID[id]
	}
	return t
}

func (t *childTable) get(p *core.Pick) (balancer.Picker, bool) {
	if i := p.Serial() - t.base; i < uint64(len(t.bySerial)) {
		if c := t.bySerial[i]; c != nil {
			return c, true
		}
	}
	c, ok := t.byID[p.ID()]
	return c, ok
}

// Pick implements balancer.Picker. It allocates nothing when the call's
// facts come from its method or from inferlb.NewContext, and one small
// value per configured header present in the outgoing metadata (grpc-go's
// metadata.ValueFromOutgoingContext copies the values it returns).
func (p *picker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	c := callPool.Get().(*call)
	req := p.request(info, c)
	if estimateInUse.Load() { // a load, and no call, without UnaryEstimate or StreamEstimate
		req = estimated(info, req, c)
	}
	// The report reads the model and the tenant from c (a Request from the
	// context, or a template, is not in it): without them, a model's
	// not-served answers and failures would be the endpoint's, and a
	// tenant's refusals would count for no tenant (inferlb.Outcome.Tenant).
	c.req.Model = req.Model
	c.req.Tenant = req.Tenant
	st, inv, ss := retriedStates(info)
	if st != nil {
		req = st.fit(req, c)
	}
	exclude := st.excluded()
	// The retry of a refusal as too long, or of a not-served answer: no
	// endpoint remembered too small for the call's tokens, or without its
	// model, on the retry budget (PickRetry). Also
	// when an earlier attempt failed elsewhere (exclude outlives it): the
	// failover pick spends no budget and takes endpoints too small for
	// the call when it finds nothing else. It does not repick (see !ok).
	windowRetry := inv != nil && inv.windowRetry.Load()
	for range 1 + maxRepicks {
		var err error
		switch {
		case windowRetry:
			retry := p.mem.PickRetry
			if inv.hop.Load() {
				retry = p.mem.PickNotServedRetry
			}
			c.pick, err = retry(req, exclude)
			if exclude != "" && errors.Is(err, core.ErrNoEndpoints) {
				// As PickFailover: where the call failed, when no
				// other endpoint might take it.
				c.pick, err = retry(req, "")
			}
		case exclude == "":
			c.pick, err = p.mem.Pick(req)
		default:
			// When nothing else can serve, retrying where it failed beats
			// waiting for a picker that may never come.
			c.pick, err = p.mem.PickFailover(req, exclude)
		}
		if err != nil {
			if p.lb != nil && (p.stale || p.lb.gen.Load() != p.gen) {
				// The membership changed since this picker was built (or
				// since the view of the children it was built from) and
				// the next one is on its way: the call waits for it, as
				// it would if it had come a moment later.
				c.release()
				return balancer.PickResult{}, balancer.ErrNoSubConnAvailable
			}
			if errors.Is(err, core.ErrClosed) {
				// A Balancer its owner closed (NewBuilder) never serves
				// again: no picker can come that a call could wait for.
				c.release()
				return balancer.PickResult{}, errBalancerClosed
			}
			if windowRetry && (errors.Is(err, core.ErrNoEndpoints) || errors.Is(err, core.ErrNoRetryBudget)) {
				c.release() // a retry that no window left might take
				return balancer.PickResult{}, errNoWindow
			}
			// Not a status error: wait-for-ready calls wait for the next
			// picker, others fail with UNAVAILABLE and this message. The
			// next picker comes when an exclusion may have ended.
			err = p.noEndpoint(req, err) // before release: req may be c's
			c.release()
			if p.lb != nil {
				p.lb.wakeLater(p.mem.Balancer())
			}
			return balancer.PickResult{}, err
		}
		child, ok := p.children.get(&c.pick)
		if !ok {
			// The core chose an endpoint with no READY child here:
			// readiness is changing and a new picker is on its way.
			c.pick.Done(inferlb.Outcome{Err: errNotSent})
			if windowRetry {
				// Not for the window retry: the endpoint it found is
				// one whose window might take the call (it has just
				// connected), and the others may all be remembered too
				// small, where a failover pick still goes. It waits for
				// the next picker, and picks there without spending
				// the budget again.
				inv.windowRetry.Store(false)
				c.release()
				return balancer.PickResult{}, balancer.ErrNoSubConnAvailable
			}
			if p.lb != nil && p.lb.gen.Load() != p.gen {
				// It entered READY since this picker was built (gen
				// moved before the core heard of it): the call waits for
				// the picker that holds its child, and picks there.
				c.release()
				return balancer.PickResult{}, balancer.ErrNoSubConnAvailable
			}
			// Otherwise give it back and ask again without it (a
			// failover keeps its own exclusion): an affinity key's owner
			// would otherwise be chosen every time, and the key goes
			// where its spills go (its next endpoints). A pick with an
			// exclusion is a failover to the core, so it does not count
			// the call's key as seen again.
			if exclude == "" {
				exclude = c.pick.ID()
			}
			continue
		}
		res, err := child.Pick(info)
		if err != nil {
			c.pick.Done(inferlb.Outcome{Err: errNotSent})
			if windowRetry {
				// PickRetry spent the budget: gRPC's next pick of this
				// attempt, if any, must not spend it again (the window
				// filter still passes over the endpoints too small).
				inv.windowRetry.Store(false)
			}
			c.release()
			return res, err
		}
		c.core = p.mem.Balancer()
		if st != nil {
			inv.core.Store(c.core)
			c.inv = inv
			c.seq, c.overlap = c.inv.picked()
			if c.seq > 1 {
				st.another(c.inv) // not the invoke's only attempt (see another)
			}
			c.retry = st
			if windowRetry {
				inv.windowRetry.Store(false) // spent
			}
		}
		if ss != nil {
			ss.attempt(c.core)
			c.stream = ss
		}
		c.perCall = p.cfg.orcaPerCall
		c.gen = req.Service == inferlb.ServiceLLM
		c.ctx = info.Ctx
		c.childDone = res.Done
		c.armed = true
		res.Done = c.doneFn
		return res, nil
	}
	c.release()
	return balancer.PickResult{}, balancer.ErrNoSubConnAvailable
}

// request gathers the call's facts: a Request from inferlb.NewContext
// first (its Service filled from the method when unset), else the method's
// Service plus the affinity key, tenant and model from the configured
// outgoing metadata. Facts from the method alone use a shared read-only
// template; otherwise the Request is built in c's scratch space.
func (p *picker) request(info balancer.PickInfo, c *call) *inferlb.Request {
	cfg := p.cfg
	ctx := info.Ctx
	if ctx != nil {
		if r, ok := inferlb.FromContext(ctx); ok {
			if r.Service != inferlb.ServiceUnknown {
				return r
			}
			svc := cfg.service(info.FullMethodName)
			if svc == inferlb.ServiceUnknown {
				return r
			}
			c.req = *r
			c.req.Service = svc
			return &c.req
		}
	}
	svc := cfg.service(info.FullMethodName)
	if ctx == nil || !cfg.readsMetadata() {
		return &cfg.templates[svc]
	}
	var key uint64
	var tenant, model string
	if h := cfg.affinityHeader; h != "" {
		if v := metadata.ValueFromOutgoingContext(ctx, h); len(v) > 0 {
			key = p.mem.Balancer().Keyer().Session(v[0])
		}
	}
	if h := cfg.tenantHeader; h != "" {
		if v := metadata.ValueFromOutgoingContext(ctx, h); len(v) > 0 {
			tenant = v[0]
		}
	}
	if h := cfg.modelHeader; h != "" {
		if v := metadata.ValueFromOutgoingContext(ctx, h); len(v) > 0 {
			model = v[0]
		}
	}
	if key == 0 && tenant == "" && model == "" {
		return &cfg.templates[svc]
	}
	c.req = inferlb.Request{Service: svc, AffinityKey: key, Session: key != 0, Tenant: tenant, Model: model}
	return &c.req
}

// call carries one pick from Pick to Done. Calls are pooled, so a pick
// allocates nothing: the Done function handed to gRPC is bound once per
// call value, and the value goes back to the pool after Done. That relies
// on gRPC calling PickResult.Done at most once, which it does (a stream
// attempt reports once when it finishes; a pick whose transport was gone is
// reported once with an empty DoneInfo and dropped). armed turns a
// duplicate Done before reuse into a no-op.
//
// Concurrency: written by Pick before the PickResult is returned and read
// by Done, which gRPC calls once, after the result has reached the call's
// attempt (the handoff orders the two); the pool orders the value's next
// use after Done. armed is a plain field for the same reason: an atomic
// one cost two locked instructions per call to guard against a concurrent
// second Done, which gRPC never makes.
type call struct {
	pick      core.Pick
	core      *core.Balancer
	childDone func(balancer.DoneInfo)
	retry     *retryState  // the UnaryRetry or UnaryOutcome interceptor's, or nil
	inv       *invoke      // with retry: the invoke the attempt was picked in
	seq       uint32       // with retry: the attempt's number in inv (invoke.picked)
	overlap   bool         // with retry: another attempt of inv was in flight during it (see retryState.park)
	stream    *streamState // the StreamTiming interceptor's, or nil
	perCall   bool
	gen       bool // a generation call (inferlb.ServiceLLM): see report
	noReply   bool // the reply was empty as the interceptor's invoker returned (retryState.unpark)
	armed     bool
	ctx       context.Context         // the call's (PickInfo.Ctx): whether its caller cancelled it (report)
	req       inferlb.Request         // scratch for Pick; after it, only its Model and Tenant are read (report)
	doneFn    func(balancer.DoneInfo) // c.done, bound once
	heldDI    balancer.DoneInfo       // while retry or stream holds the report (retryState.hold, streamState.hold)
	heldStop  func() bool             // stops the held stream's AfterFunc (streamState.hold)
}

// callPool's New is set in init: done refers to the pool, so a composite
// literal would be an initialization cycle.
var callPool sync.Pool

func init() {
	callPool.New = func() any {
		c := &call{}
		c.doneFn = c.done
		return c
	}
}

func (c *call) done(di balancer.DoneInfo) {
	if !c.armed {
		return
	}
	c.armed = false
	if c.childDone != nil {
		c.childDone(di)
	}
	if c.inv != nil && c.inv.ended(c.seq) {
		c.overlap = true // another attempt was picked while this one ran
	}
	if c.retry != nil && di.Err == nil && di.BytesReceived && c.retry.hold(c, di) {
		return // reported once the interceptor sees the call's error (see hold)
	}
	if c.stream != nil && di.Err == nil && di.BytesReceived && c.stream.sending.Load() && c.stream.hold(c, di) {
		return // reported once the application reads the stream's end (see streamState.hold)
	}
	if c.retry != nil && c.gen && di.BytesReceived && isCancel(di.Err) && c.ctx != nil && c.ctx.Err() == context.Canceled && c.retry.park(c, di) {
		// Reported as the interceptor's invoker returns, which reads the
		// reply then (see retryState.unanswered), or as the next attempt
		// is picked (another). Only a cancel after bytes came: the
		// caller's, or an interceptor's inside ours on an attempt that
		// overlapped no other of its invoke (see retryState.park).
		return
	}
	c.report(di)
}

// report reports an attempt's end to the core and puts c back in its pool.
func (c *call) report(di balancer.DoneInfo) {
	o := outcome(di)
	if o.ContextWindow > 0 && !c.believed() {
		o = outcomeOf(di, false)
	}
	if c.retry != nil {
		c.retry.attemptDone(c.inv, c.pick.ID(), di, &o)
	}
	if c.perCall && di.ServerLoad != nil {
		if r, ok := di.ServerLoad.(*v3orcapb.OrcaLoadReport); ok {
			if s, bad := sampleFromORCA(r, c.core.Now()); bad || !s.Empty() {
				if bad && !s.Empty() {
					c.core.Telemetry().CountPartial()
				}
				c.core.Publish(c.pick.ID(), s) // an empty one is counted (see sampleFromORCA)
			}
		}
	}
	answered := serverFailure(di)
	if c.stream != nil { // the core reads TTFT of successes and cancellations
		c.stream.fill(&o, c.pick.Stamped()) // and marks a deadline mid-stream
		if c.stream.inbandOutcome(&o) {
			answered = true // an error in a message of the server's
			if o.ContextWindow > 0 && !c.believed() {
				o.ContextWindow, o.PromptWindow = 0, false // an answer
			}
		}
	}
	if c.stream != nil && !o.Unanswered && di.BytesReceived && o.Canceled() && isCancel(di.Err) && c.stream.unanswered(c.pick.Stamped()) {
		// The server's headers, and no message: a hung engine's
		// server sends them at once (see streamState.unanswered).
		o.Unanswered = true
	}
	if c.retry != nil && c.gen && !o.Unanswered && di.BytesReceived && o.Canceled() && isCancel(di.Err) && c.noReply {
		// A unary generation call's headers, and no message: a server
		// may send them before its answer (see retryState.unanswered).
		// Only a generation's: an embedding's or rerank's unanswered
		// wait raises its latency (inferlb.Outcome.Unanswered), a reading
		// of headers this leaves as it was for them.
		o.Unanswered = true
	}
	if o.Unanswered && (c.ctx == nil || c.ctx.Err() != context.Canceled) {
		// Cancelled with nothing back, but not by the caller: a reset
		// with CANCEL (a proxy's) is no wait the caller gave up on.
		o.Unanswered = false
	}
	switch {
	case o.Err == errUnknownModel && c.req.Model != "":
		o = inferlb.Outcome{NotServedModel: c.req.Model}
	case o.ContextWindow > 0:
		// Neither success nor failure; the window is the model's there.
		o = inferlb.Outcome{ContextWindow: o.ContextWindow, PromptWindow: o.PromptWindow, Model: c.req.Model}
		if c.retry != nil {
			c.retry.refusedTooLong(c.inv, di) // retried elsewhere (see UnaryRetry)
		}
	case !o.Overloaded && (o.Err == nil || answered && !o.Canceled()):
		// The server answered for the model: a failure it returned may be
		// the model's alone on a server that serves others (see
		// inferlb.Outcome.Model); a broken connection is the endpoint's.
		o.Model = c.req.Model
	}
	o.Tenant = c.req.Tenant // a refusal of the tenant's calls only (inferlb.Outcome.Tenant)
	c.pick.Done(o)
	c.release()
}

// believed reports whether a refusal of the call as too long is believed:
// not when the call's request message carries a refusal's text itself, or
// cannot be read for one (see carriesRefusal). A unary call's interceptor
// (UnaryRetry, UnaryOutcome) gives the message, StreamTiming's stream the
// first the application sent (see streamState.believed). Such a refusal
// is the answer its code makes it: nothing remembered, no retry. A call
// without them gives no message, and its refusal is believed.
func (c *call) believed() bool {
	switch {
	case c.retry != nil:
		return c.retry.believed()
	case c.stream != nil:
		return c.stream.believed()
	}
	return true
}

func (c *call) release() {
	c.pick = core.Pick{}
	c.core = nil
	c.childDone = nil
	c.retry = nil
	c.inv = nil
	c.seq = 0
	c.overlap = false
	c.stream = nil
	c.gen = false
	c.noReply = false
	c.ctx = nil
	c.req = inferlb.Request{}
	c.heldDI = balancer.DoneInfo{}
	c.heldStop = nil
	callPool.Put(c)
}
