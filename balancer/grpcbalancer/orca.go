package grpcbalancer

import (
	"sync"
	"time"

	v3orcapb "github.com/cncf/xds/go/xds/data/orca/v3"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/orca"

	"github.com/inferlb/inferlb/telemetry"
)

// namedMetric maps an ORCA named metric (or named utilization) onto a
// telemetry field. The names are those model servers use in their ORCA
// reports (vLLM's endpoint-load-metrics: kv_cache_usage_perc,
// num_requests_waiting, num_requests_running) plus plain aliases.
type namedMetric struct {
	name     string
	field    telemetry.Field
	fraction bool // a 0..1 fraction; a value outside is dropped, as loadheader.Parse does
}

var namedMetrics = [...]namedMetric{
	{"kv_cache_usage", telemetry.KVCacheUsage, true},
	{"kv_cache_usage_perc", telemetry.KVCacheUsage, true},
	{"kv_cache_utilization", telemetry.KVCacheUsage, true},
	{"gpu_cache_usage_perc", telemetry.KVCacheUsage, true},
	{"num_requests_waiting", telemetry.Waiting, false},
	{"queue_depth", telemetry.Waiting, false},
	{"num_requests_running", telemetry.Running, false},
	{"prefix_cache_hit_rate", telemetry.PrefixCacheHitRate, true},
}

// sampleFromORCA converts an ORCA load report (gRFC A51: per-call in the
// trailer or out-of-band on a stream) into a telemetry sample observed at now.
//
// cpu_utilization and application_utilization are proto3 scalars without
// presence, so 0 reads as "not reported", as weighted round robin does
// (gRFC A58): a per-call report that sets only a named metric must not
// erase the utilization an out-of-band stream reported. Named metrics are
// map entries, present or not, so 0 there is a value.
//
// bad reports a value no server measures (NaN, an infinity, a negative
// utilization or count, a fraction above 1): it is left out of the sample.
// The caller publishes a report with bad values even when nothing else is
// left, so that the Store counts it as malformed (DroppedEmpty), as the
// HTTP transport counts an unreadable load header; one with good values
// left is counted in StoreStats.Partial (Store.CountPartial).
func sampleFromORCA(r *v3orcapb.OrcaLoadReport, now time.Time) (s telemetry.Sample, bad bool) {
	s = telemetry.Sample{Time: now}
	if r == nil {
		return s, false
	}
	for _, u := range [...]struct {
		f telemetry.Field
		v float64
	}{{telemetry.CPUUtil, r.GetCpuUtilization()}, {telemetry.AppUtil, r.GetApplicationUtilization()}} {
		switch {
		case u.v == 0: // not reported
		case u.v > 0 && s.Set(u.f, u.v):
		default:
			bad = true
		}
	}
	named, util := r.GetNamedMetrics(), r.GetUtilization()
	if len(named) == 0 && len(util) == 0 {
		return s, bad
	}
	for _, m := range namedMetrics {
		v, ok := named[m.name]
		if !ok {
			if v, ok = util[m.name]; !ok {
				continue
			}
		}
		if v < 0 || (m.fraction && v > 1) {
			bad = true
			continue
		}
		if old, ok := s.Get(m.field); ok && old >= v {
			// Two names of one field (a server that exports both
			// spellings, old and new): the larger, as the HTTP load
			// header's parser keeps it, not whichever this list
			// names last.
			continue
		}
		if !s.Set(m.field, v) {
			bad = true
		}
	}
	return s, bad
}

// subConn tracks one SubConn a pickfirst child created, to run an
// out-of-band ORCA listener on it while it is READY.
//
// Concurrency: lb and addr are immutable; sc is set once, right after
// creation, before any state update can arrive. mu guards ready and stop.
// Listener registration and stop happen without lb.mu held: stop waits for
// the ORCA producer's goroutine, which may be delivering a report.
type subConn struct {
	lb   *lbBalancer
	addr string // the address it connects to; the endpoint's ID is looked up per report
	sc   balancer.SubConn

	mu    sync.Mutex
	ready bool
	stop  func() // stops the OOB listener; nil when none runs
}

var _ orca.OOBListener = (*subConn)(nil)

// OnLoadReport implements orca.OOBListener.
// The report goes to the endpoint that has the SubConn's address now: the
// resolver may rename an endpoint (WithEndpoint, idByHost) and keep its
// address, and pickfirst then keeps the SubConn.
func (s *subConn) OnLoadReport(r *v3orcapb.OrcaLoadReport) {
	id := s.lb.idOf(s.addr)
	if id == "" {
		return // its address left the resolver's endpoints
	}
	if b := s.lb.core.Load(); b != nil {
		if smp, bad := sampleFromORCA(r, b.Now()); bad || !smp.Empty() {
			if bad && !smp.Empty() {
				b.Telemetry().CountPartial()
			}
			b.Publish(id, smp) // an empty one is counted (see sampleFromORCA)
		}
	}
}

// onState follows the SubConn's connectivity: the ORCA producer lives only
// while the SubConn is READY, so a listener is registered on each READY and
// stopped when it leaves READY or shuts down.
//
// A READY of an endpoint this channel had connected to before is a new
// connection, perhaps to a new process (the server restarted): the load
// fields observed before it (telemetry.ProcessLoad, whichever source
// published them) are expired, as weighted round robin (gRFC A58) forgets an endpoint's
// weight on each READY. Kept, the old process's last report (a full KV
// cache, a long queue) priced the new, idle one out of rotation until it
// aged out (balancer.telemetryMaxAge, 30 s by default): with per-call
// reports only, no call went there to bring a new one, and an idle new
// process's out-of-band utilization of 0 reads as "not reported", so it
// replaced nothing either. It is done before the listener is registered,
// so the new connection's first report is kept. An endpoint's first READY
// in the channel expires nothing: what another channel or a Poller
// published about it (on a shared Balancer) describes the process this
// connection reaches.
func (s *subConn) onState(st balancer.SubConnState) {
	s.mu.Lock()
	s.ready = st.ConnectivityState == connectivity.Ready
	s.mu.Unlock()
	if st.ConnectivityState == connectivity.Ready {
		s.lb.reconnected(s.addr)
	}
	if st.ConnectivityState == connectivity.Shutdown {
		s.lb.forget(s)
	}
	s.refresh()
}

// refresh starts or stops the OOB listener to match readiness and config.
//
// The config is read under mu: two refreshes (a config push and a state
// change) may run at once, and the one that registers last must not bring
// back the config the other replaced. Lock order: mu, then the policy's mu.
func (s *subConn) refresh() {
	s.mu.Lock()
	defer s.mu.Unlock()
	enabled, interval := s.lb.oobConfig()
	if s.stop != nil {
		s.stop()
		s.stop = nil
	}
	if s.ready && enabled {
		s.stop = orca.RegisterOOBListener(s.sc, s, orca.OOBListenerOptions{ReportInterval: interval})
	}
}

// close stops the listener for good.
func (s *subConn) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ready = false
	if s.stop != nil {
		s.stop()
		s.stop = nil
	}
}
