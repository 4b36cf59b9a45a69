package balancer_test

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/scoring"
)

// TestOptionsValidateNamesEachField: every field of Options that has a
// rule fails Validate (and New) with an error that names it, and every
// field is either in this table or listed as taking any value, so a new
// option cannot be added without deciding which.
func TestOptionsValidateNamesEachField(t *testing.T) {
	bad := []struct {
		field string
		opts  balancer.Options
	}{
		{"ErrorAlpha", balancer.Options{ErrorAlpha: math.NaN()}},
		{"ErrorAlpha", balancer.Options{ErrorAlpha: -0.1}},
		{"PanicThreshold", balancer.Options{PanicThreshold: 1.5}},
		{"PanicThreshold", balancer.Options{PanicThreshold: math.NaN()}},
		{"SlowStartMinWeight", balancer.Options{SlowStartMinWeight: 2}},
		{"SlowStartAggression", balancer.Options{SlowStartAggression: math.Inf(1)}},
		{"RetryRatio", balancer.Options{RetryRatio: math.Inf(-1)}},
		{"RetryFloor", balancer.Options{RetryFloor: math.NaN()}},
		{"Affinity", balancer.Options{Affinity: balancer.AffinityStrict + 1}},
		{"LoadBound", balancer.Options{LoadBound: 1}},
		{"LoadBound", balancer.Options{LoadBound: math.NaN()}},
		{"LoadBound", balancer.Options{LoadBound: math.Inf(1)}},
		{"MinKeyReuse", balancer.Options{MinKeyReuse: 1.01}},
		{"AdapterHomes", balancer.Options{AdapterHomes: math.Inf(1)}},
		{"ScanLimit", balancer.Options{ScanLimit: 1}},
		{"ScanLimit", balancer.Options{ScanLimit: balancer.MaxScanLimit + 1}},
		{"TenantShardSize", balancer.Options{TenantShardSize: -1}},
		{"TenantShardSize", balancer.Options{TenantShardSize: balancer.MaxTenantShard + 1}},
		{"TenantShardStrict", balancer.Options{TenantShardStrict: true}},
		{"StickyEntries", balancer.Options{StickyEntries: -1}},
		{"BreakerProbes", balancer.Options{BreakerProbes: -1}},
		{"EjectionTime", balancer.Options{EjectionTime: -time.Second}},
		{"MaxEjectionTime", balancer.Options{MaxEjectionTime: -time.Second}},
		{"MaxEjectedFraction", balancer.Options{MaxEjectedFraction: 1.5}},
		{"OutlierMinRequests", balancer.Options{OutlierMinRequests: -1}},
		{"OutlierMargin", balancer.Options{OutlierMargin: -0.2}},
		{"LatencyDecay", balancer.Options{LatencyDecay: -time.Second}},
		{"ErrorDecay", balancer.Options{ErrorDecay: -time.Second}},
		{"DefaultCooldown", balancer.Options{DefaultCooldown: -time.Second}},
		{"MaxCooldown", balancer.Options{MaxCooldown: -time.Second}},
		{"NotServedMemory", balancer.Options{NotServedMemory: balancer.MaxNotServedMemory + time.Second}},
		{"Scorers", balancer.Options{Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceLLM: nil}}},
		{"SubsetLabel", balancer.Options{SubsetLabel: balancer.DefaultDPGroupLabel}},
		{"DPGroupLabel", balancer.Options{DPGroupLabel: balancer.DefaultSubsetLabel}},
		{"SubsetLabel", balancer.Options{SubsetLabel: "pool", DPGroupLabel: "pool"}},
	}
	// Fields whose every value means something: a nil default or seed.
	anyValue := map[string]bool{
		"Clock": true, "Rand": true, "Telemetry": true, "AffinitySeed": true,
		"OnEvent": true,
	}
	if n, ok := wideInt(math.MaxInt32 + 1); ok {
		bad = append(bad, struct {
			field string
			opts  balancer.Options
		}{"BreakerFailures", balancer.Options{BreakerFailures: n}})
	} else {
		anyValue["BreakerFailures"] = true // a 32-bit int is never past its bound
	}
	// A bare number in a Duration is nanoseconds: TelemetryMaxAge: 30,
	// meant as seconds, made every reading stale, EjectionTime: 10 held a
	// tripped endpoint out for 10ns. Each duration set positive is at
	// least a millisecond.
	durations := 0
	for i := range reflect.TypeFor[balancer.Options]().NumField() {
		f := reflect.TypeFor[balancer.Options]().Field(i)
		if f.Type != reflect.TypeFor[time.Duration]() {
			continue
		}
		durations++
		var o balancer.Options
		reflect.ValueOf(&o).Elem().Field(i).SetInt(30)
		bad = append(bad, struct {
			field string
			opts  balancer.Options
		}{f.Name, o})
		reflect.ValueOf(&o).Elem().Field(i).SetInt(int64(time.Millisecond))
		assert.NoError(t, o.Validate(), "%s: 1ms", f.Name)
	}
	assert.Equal(t, 12, durations, "the Options durations")
	covered := map[string]bool{}
	for _, tc := range bad {
		covered[tc.field] = true
		err := tc.opts.Validate()
		if !assert.Error(t, err, "%s: %+v", tc.field, tc.opts) {
			continue
		}
		assert.True(t, strings.HasPrefix(err.Error(), "inferlb: balancer.Options."+tc.field), "%s: %v", tc.field, err)
		assert.PanicsWithError(t, err.Error(), func() { balancer.New(tc.opts) }, "New refuses what Validate does")
	}
	assert.NoError(t, (&balancer.Options{SubsetLabel: "pool", DPGroupLabel: "engine"}).Validate(), "distinct labels")
	assert.NoError(t, (&balancer.Options{SubsetLabel: balancer.DefaultSubsetLabel, DPGroupLabel: balancer.DefaultDPGroupLabel}).Validate(), "the defaults, spelled out")
	typ := reflect.TypeFor[balancer.Options]()
	for i := range typ.NumField() {
		name := typ.Field(i).Name
		assert.True(t, covered[name] != anyValue[name], "Options.%s: give it a bad value here, or list it as taking any value", name)
	}
}
