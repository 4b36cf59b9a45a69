package grpcbalancer

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	core "github.com/inferlb/inferlb/balancer"
)

// TestDocumentedConfigShowsTheDefaults reads the annotated config object of
// the package doc, which presents each "balancer" tunable with its default
// ("0 or absent = the core's default"), and checks every value shown against
// the default the code applies, and that no tunable the config accepts is
// missing from it: a default changed in code, or a tunable added to the
// config, cannot leave the doc showing another value or nothing.
func TestDocumentedConfigShowsTheDefaults(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	var obj []string
	in := false
	for line := range strings.SplitSeq(string(doc), "\n") {
		code, ok := strings.CutPrefix(line, "//\t")
		if !ok {
			in = false
			continue
		}
		if code == "{" {
			in = true
		}
		if in {
			if i := strings.Index(code, "//"); i >= 0 {
				code = code[:i]
			}
			obj = append(obj, code)
		}
	}
	var cfg struct {
		ORCA     map[string]json.RawMessage `json:"orca"`
		Balancer map[string]json.RawMessage `json:"balancer"`
	}
	if err := json.Unmarshal([]byte(strings.Join(obj, "\n")), &cfg); err != nil || cfg.Balancer == nil {
		t.Fatalf("doc.go: the annotated config object was not found or is not JSON: %v", err)
	}

	// What each zero (or absent) tunable means, from the code's constants.
	want := map[string]any{
		"telemetryMaxAge":     core.DefaultTelemetryMaxAge,
		"latencyDecay":        core.DefaultLatencyDecay,
		"errorAlpha":          core.DefaultErrorAlpha,
		"errorDecay":          core.DefaultErrorDecay,
		"panicThreshold":      core.DefaultPanicThreshold,
		"defaultCooldown":     core.DefaultCooldown,
		"maxCooldown":         core.DefaultMaxCooldown,
		"notServedMemory":     core.DefaultNotServedMemory,
		"slowStartWindow":     core.DefaultSlowStartWindow,
		"slowStartMinWeight":  core.DefaultSlowStartMin,
		"slowStartAggression": 1.0,
		"retryRatio":          core.DefaultRetryRatio,
		"retryFloor":          float64(core.DefaultRetryFloor),
		"affinity":            "prefer",
		"loadBound":           core.DefaultLoadBound,
		"affinitySeed":        0.0, // a random per-process seed
		"tenantShardSize":     0.0, // off
		"tenantShardStrict":   false,
		"spillMemory":         core.DefaultSpillMemory,
		"minKeyReuse":         core.DefaultMinKeyReuse,
		"adapterHomes":        core.DefaultAdapterHomes,
		"scanLimit":           float64(core.DefaultScanLimit),
		"breakerFailures":     float64(core.DefaultBreakerFailures),
		"breakerProbes":       float64(core.DefaultBreakerProbes),
		"ejectionTime":        core.DefaultEjectionTime,
		"maxEjectionTime":     core.DefaultMaxEjectionTime,
		"maxEjectedFraction":  core.DefaultMaxEjectedFraction,
		"outlierInterval":     core.DefaultOutlierInterval,
		"outlierMinRequests":  float64(core.DefaultOutlierMinRequests),
		"outlierMargin":       core.DefaultOutlierMargin,
		"subsetLabel":         core.DefaultSubsetLabel,
		"dpGroupLabel":        core.DefaultDPGroupLabel,
		"stickyTTL":           time.Duration(0), // off
		"stickyEntries":       0.0,              // cache.DefaultMaxSessions
	}
	// Every tunable the config accepts has an expected default here, and a
	// value in the doc.
	tun := reflect.TypeFor[jsonTunables]()
	for i := range tun.NumField() {
		name, _, _ := strings.Cut(tun.Field(i).Tag.Get("json"), ",")
		if _, ok := want[name]; !ok {
			t.Errorf("balancer.%s: accepted by the config but not in this test's defaults", name)
		}
		if _, ok := cfg.Balancer[name]; !ok {
			t.Errorf("doc.go: balancer.%s is accepted by the config but missing from the annotated object", name)
		}
	}
	check := func(field string, raw json.RawMessage, w any) {
		t.Helper()
		switch w := w.(type) {
		case time.Duration:
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				t.Errorf("doc.go: %s = %s: not a duration string", field, raw)
				return
			}
			d, err := time.ParseDuration(s)
			if err != nil || d != w {
				t.Errorf("doc.go shows %s = %s; the default is %v", field, raw, w)
			}
		case float64:
			var f float64
			if err := json.Unmarshal(raw, &f); err != nil || f != w {
				t.Errorf("doc.go shows %s = %s; the default is %v", field, raw, w)
			}
		case string:
			var s string
			if err := json.Unmarshal(raw, &s); err != nil || s != w {
				t.Errorf("doc.go shows %s = %s; the default is %q", field, raw, w)
			}
		case bool:
			var b bool
			if err := json.Unmarshal(raw, &b); err != nil || b != w {
				t.Errorf("doc.go shows %s = %s; the default is %v", field, raw, w)
			}
		default:
			t.Fatalf("%s: no check for %T", field, w)
		}
	}
	for name, raw := range cfg.Balancer {
		w, ok := want[name]
		if !ok {
			t.Errorf("doc.go shows balancer.%s, which the config does not accept", name)
			continue
		}
		check("balancer."+name, raw, w)
	}

	// The orca section shows its defaults too.
	c, err := parseConfig(json.RawMessage(`{}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, w := range map[string]any{"perCall": c.orcaPerCall, "outOfBand": c.oob, "interval": c.oobInterval} {
		raw, ok := cfg.ORCA[name]
		if !ok {
			t.Errorf("doc.go: orca.%s missing from the annotated object", name)
			continue
		}
		check("orca."+name, raw, w)
	}
}
