package balancer_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// refusedTenants returns EndpointStats.RefusedTenants by endpoint ID.
func refusedTenants(t *testing.T, b *balancer.Balancer) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, s := range b.Stats() {
		out[s.ID] = s.RefusedTenants
	}
	return out
}

// pickAt picks addr for a call of tenant's, as a probe reaches it.
func (r *tenantRun) pickAt(addr, tenant string) balancer.Pick {
	r.t.Helper()
	serial, ok := r.b.Serial(addr)
	require.True(r.t, ok, addr)
	p, err := r.b.PickAt(&inferlb.Request{Service: r.svc, Tenant: tenant}, serial)
	require.NoError(r.t, err)
	require.Equal(r.t, addr, p.ID())
	return p
}

// EndpointStats.RefusedTenants shows the tenants' refusals memory: r0
// refuses the calls of A and B (their keys have not reached it) and
// serves C..E; once it has refused a run of each, it counts both, its
// peers none; with no calls of theirs since, the marks end ErrorDecay
// after their last refusal there, and the count with them. A tenant
// refused everywhere (its own key expired) passes nothing over, and is
// not counted.
func TestStatsCountTheTenantsAnEndpointIsPassedOverFor(t *testing.T) {
	r := newTenantRun(t, balancer.Options{Rand: testutil.NewRand(11)}, "r0", "r1", "r2", "r3")
	r.tenant = tenantMix(30)
	assert.Equal(t, map[string]int{"r0": 0, "r1": 0, "r2": 0, "r3": 0}, refusedTenants(t, r.b), "nothing remembered")
	r.refuse = func(addr, tn string, _ int) bool { return addr == "r0" && tn == "A" }
	r.rounds(500, 4) // 10 s
	assert.Equal(t, map[string]int{"r0": 1, "r1": 0, "r2": 0, "r3": 0}, refusedTenants(t, r.b), "r0 refuses A")

	r.refuse = func(addr, tn string, _ int) bool { return addr == "r0" && (tn == "A" || tn == "B") || tn == "E" }
	r.rounds(500, 4)
	assert.Equal(t, map[string]int{"r0": 2, "r1": 0, "r2": 0, "r3": 0}, refusedTenants(t, r.b), "r0 refuses A and B; E is refused everywhere")

	// A mark holds ErrorDecay from the tenant's last refusal there,
	// rounded up to the table's units (16.8 ms): a probe of each, refused.
	for _, tn := range []string{"A", "B"} {
		p := r.pickAt("r0", tn)
		p.Done(inferlb.Outcome{Latency: time.Millisecond, ClientError: true, Tenant: tn})
	}
	r.clock.Advance(balancer.DefaultErrorDecay - 100*time.Millisecond)
	assert.Equal(t, 2, refusedTenants(t, r.b)["r0"], "just before ErrorDecay")
	r.clock.Advance(200 * time.Millisecond)
	assert.Equal(t, map[string]int{"r0": 0, "r1": 0, "r2": 0, "r3": 0}, refusedTenants(t, r.b), "past ErrorDecay")
}

// A call of the tenant's that the endpoint serves ends its mark there, and
// the count drops at once.
func TestStatsRefusedTenantsDropWhenTheEndpointServesTheTenant(t *testing.T) {
	r := newTenantRun(t, balancer.Options{Rand: testutil.NewRand(12)}, "r0", "r1", "r2", "r3")
	r.tenant = tenantMix(30)
	r.refuse = func(addr, tn string, _ int) bool { return addr == "r0" && tn == "A" }
	r.rounds(500, 4)
	require.Equal(t, 1, refusedTenants(t, r.b)["r0"])
	p := r.pickAt("r0", "A")
	r.clock.Advance(20 * time.Millisecond)
	p.Done(inferlb.Outcome{Latency: 20 * time.Millisecond, Tenant: "A"})
	assert.Zero(t, refusedTenants(t, r.b)["r0"], "r0 served A")
}

// A pass-over's beginning is an event (EventTenantRefused), for the
// endpoint and tenant: r0 refuses A's calls and serves the others'; E's
// calls are refused everywhere (its own key expired) and pass nothing
// over. One event comes when r0's run of A's refusals is long enough, and
// another each time a refused probe starts the pass-over again, once per
// ErrorDecay; none while it is in force.
func TestTenantRefusedEventMarksEachPassOver(t *testing.T) {
	t.Parallel()
	var events []balancer.Event
	r := newTenantRun(t, balancer.Options{Rand: testutil.NewRand(13), OnEvent: func(ev balancer.Event) {
		events = append(events, ev)
	}}, "r0", "r1", "r2", "r3")
	r.tenant = tenantMix(30)
	r.refuse = func(addr, tn string, _ int) bool { return addr == "r0" && tn == "A" || tn == "E" }
	start := r.clock.Now()
	r.rounds(500, 40) // 10 s, 2,000 calls a second: refusals of calls picked before the pass-over began come after it
	require.Len(t, events, 1)
	ev := events[0]
	assert.Equal(t, balancer.EventTenantRefused, ev.Kind)
	assert.Equal(t, "tenant-refused", ev.Kind.String())
	assert.Equal(t, "r0", ev.Endpoint)
	assert.Equal(t, "A", ev.Tenant)
	assert.Equal(t, balancer.DefaultErrorDecay, ev.Until.Sub(ev.At))
	assert.Less(t, ev.At.Sub(start), 5*time.Second, "the run builds up in the first seconds")
	assert.Equal(t, map[string]int{"r0": 1, "r1": 0, "r2": 0, "r3": 0}, refusedTenants(t, r.b))
	// A call of A's that reaches r0 meanwhile (picked before the
	// pass-over began, or with it capped by MaxEjectedFraction), refused,
	// extends the pass-over and begins none.
	p := r.pickAt("r0", "A")
	p.Done(inferlb.Outcome{Latency: time.Millisecond, ClientError: true, Tenant: "A"})
	require.Len(t, events, 1)

	r.rounds(2000, 40) // to 50 s: the pass-over ends and a probe starts it again
	var again []time.Time
	for _, ev := range events {
		require.Equal(t, balancer.EventTenantRefused, ev.Kind)
		require.Equal(t, "r0", ev.Endpoint)
		require.Equal(t, "A", ev.Tenant)
		again = append(again, ev.At)
	}
	require.Len(t, again, 2, "one more after ErrorDecay")
	assert.GreaterOrEqual(t, again[1].Sub(again[0]), balancer.DefaultErrorDecay)
}

// An endpoint removed and added back under its ID is a new endpoint, with
// clean state: the old one's marks are not counted for it, as picks do
// not pass it over for them.
func TestStatsRefusedTenantsAreTheEndpointsNotItsIDs(t *testing.T) {
	r := newTenantRun(t, balancer.Options{Rand: testutil.NewRand(14)}, "r0", "r1", "r2", "r3")
	r.tenant = tenantMix(30)
	r.refuse = func(addr, tn string, _ int) bool { return addr == "r0" && tn == "A" }
	r.rounds(500, 4)
	require.Equal(t, 1, refusedTenants(t, r.b)["r0"])
	require.NoError(t, r.b.Update([]inferlb.Endpoint{{Addr: "r1"}, {Addr: "r2"}, {Addr: "r3"}}))
	require.NoError(t, r.b.Update([]inferlb.Endpoint{{Addr: "r0"}, {Addr: "r1"}, {Addr: "r2"}, {Addr: "r3"}}))
	assert.Equal(t, map[string]int{"r0": 0, "r1": 0, "r2": 0, "r3": 0}, refusedTenants(t, r.b))
}

// Stats reads the memory while calls of many tenants are refused and
// served from several goroutines (run under -race): a count never exceeds
// the tenants that could be marked, and the endpoint that refuses no one
// counts none.
func TestStatsRefusedTenantsUnderConcurrency(t *testing.T) {
	const workers = 4
	r := newTenantRun(t, balancer.Options{Rand: testutil.NewRand(15)}, "r0", "r1", "r2", "r3")
	var g errgroup.Group
	for w := range workers {
		g.Go(func() error {
			for i := range 2000 {
				tn := fmt.Sprintf("t%d", (w+i)%8)
				p, err := r.b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding, Tenant: tn})
				if err != nil {
					return err
				}
				// r0 refuses t0..t3, r1 refuses t0; t7 is refused everywhere.
				id := p.ID()
				ce := id == "r0" && tn < "t4" || id == "r1" && tn == "t0" || tn == "t7"
				p.Done(inferlb.Outcome{Latency: time.Millisecond, ClientError: ce, Tenant: tn})
			}
			return nil
		})
	}
	g.Go(func() error {
		for range 200 {
			for _, s := range r.b.Stats() {
				if s.RefusedTenants < 0 || s.RefusedTenants > 4 || s.ID == "r2" && s.RefusedTenants != 0 {
					return fmt.Errorf("%s: %d refused tenants", s.ID, s.RefusedTenants)
				}
			}
		}
		return nil
	})
	require.NoError(t, g.Wait())
	got := refusedTenants(t, r.b)
	t.Logf("refused tenants: %v", got)
	assert.LessOrEqual(t, got["r0"], 4)
	assert.LessOrEqual(t, got["r1"], 1)
	assert.Zero(t, got["r2"])
	assert.Zero(t, got["r3"])
}
