package grpcbalancer

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
)

func TestParseConfigDefaults(t *testing.T) {
	for _, js := range []string{``, `{}`, ` { } `} {
		c, err := parseConfig([]byte(js), nil)
		if err != nil {
			t.Fatalf("parseConfig(%q): %v", js, err)
		}
		if c.defaultService != inferlb.ServiceUnknown || c.readsMetadata() || c.exact != nil || c.prefix != nil {
			t.Errorf("parseConfig(%q) = %+v, want no methods, no headers", js, c)
		}
		if !c.orcaPerCall || c.oob || c.oobInterval != DefaultOOBInterval {
			t.Errorf("parseConfig(%q): orca perCall %v oob %v interval %v, want true false %v", js, c.orcaPerCall, c.oob, c.oobInterval, DefaultOOBInterval)
		}
		if c.hasTunables {
			t.Errorf("parseConfig(%q): want no tunables", js)
		}
	}
}

func TestParseConfigGood(t *testing.T) {
	c, err := parseConfig([]byte(`{
		"methods": {"/pkg.Svc/Embed": "embedding", "/pkg.Svc/": "llm", "/r.R/Rank": "reranker"},
		"defaultService": "chat",
		"affinityKeyHeader": "X-Session-ID",
		"tenantHeader": "x-tenant",
		"modelHeader": "x-model",
		"idByHost": true,
		"orca": {"perCall": false, "outOfBand": true, "interval": "1.5s"},
		"balancer": {"telemetryMaxAge": "-1s", "latencyDecay": "5s", "errorAlpha": 0.2, "panicThreshold": -1,
			"slowStartWindow": "1m", "retryRatio": 0.1, "breakerFailures": 3, "ejectionTime": "30s",
			"maxEjectedFraction": 0.3, "outlierMargin": 0.1, "subsetLabel": "models", "dpGroupLabel": "engine",
			"affinity": "strict", "loadBound": 1.5, "affinitySeed": 18446744073709551615, "tenantShardSize": 4,
			"tenantShardStrict": true,
			"spillMemory": "-1s", "minKeyReuse": -1, "stickyTTL": "2m", "stickyEntries": 4096,
			"notServedMemory": "1m", "adapterHomes": 0.5, "scanLimit": -1}
	}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	for method, want := range map[string]inferlb.Service{
		"/pkg.Svc/Embed": inferlb.ServiceEmbedding,
		"/pkg.Svc/Chat":  inferlb.ServiceLLM,
		"/r.R/Rank":      inferlb.ServiceRerank,
		"/r.R/Other":     inferlb.ServiceLLM, // the default, "chat"
		"/pkg.Svc":       inferlb.ServiceLLM, // malformed: the default
		"":               inferlb.ServiceLLM,
	} {
		if got := c.service(method); got != want {
			t.Errorf("service(%q) = %v, want %v", method, got, want)
		}
	}
	if !c.idByHost {
		t.Error("idByHost not set")
	}
	if c.affinityHeader != "x-session-id" || c.tenantHeader != "x-tenant" || c.modelHeader != "x-model" {
		t.Errorf("headers %q %q %q", c.affinityHeader, c.tenantHeader, c.modelHeader)
	}
	if o := c.opts; o.Affinity != core.AffinityStrict || o.LoadBound != 1.5 || o.AffinitySeed != 18446744073709551615 || o.TenantShardSize != 4 || !o.TenantShardStrict ||
		o.SpillMemory != -time.Second || o.MinKeyReuse != -1 || o.StickyTTL != 2*time.Minute || o.StickyEntries != 4096 ||
		o.NotServedMemory != time.Minute || o.AdapterHomes != 0.5 || o.ScanLimit != -1 {
		t.Errorf("affinity options %v %v %v %v %v %v %v %v", o.Affinity, o.LoadBound, o.AffinitySeed, o.TenantShardSize, o.SpillMemory, o.MinKeyReuse, o.AdapterHomes, o.ScanLimit)
	}
	if c.orcaPerCall || !c.oob || c.oobInterval != 1500*time.Millisecond {
		t.Errorf("orca %v %v %v", c.orcaPerCall, c.oob, c.oobInterval)
	}
	o := c.opts
	if o.TelemetryMaxAge != -time.Second || o.LatencyDecay != 5*time.Second || o.ErrorAlpha != 0.2 || o.PanicThreshold != -1 ||
		o.SlowStartWindow != time.Minute || o.RetryRatio != 0.1 || o.BreakerFailures != 3 || o.EjectionTime != 30*time.Second ||
		o.MaxEjectedFraction != 0.3 || o.OutlierMargin != 0.1 || o.SubsetLabel != "models" || o.DPGroupLabel != "engine" {
		t.Errorf("options %+v", o)
	}
}

func TestParseConfigBad(t *testing.T) {
	tests := []struct {
		name   string
		js     string
		shared bool
		want   string // substring of the error, after the common prefix
	}{
		{"not JSON", `{`, false, "invalid JSON"},
		{"not an object", `[]`, false, "want an object"},
		{"trailing data", `{} {}`, false, "unexpected data"},
		{"unknown field", `{"method": {}}`, false, `unknown field "method"`},
		{"unknown nested field", `{"balancer": {"errorAlfa": 0.1}}`, false, `unknown field "balancer.errorAlfa"`},
		{"unknown orca field", `{"orca": {"oob": true}}`, false, `unknown field "orca.oob"`},
		{"methods not an object", `{"methods": ["x"]}`, false, "field methods: got JSON array"},
		{"method value type", `{"methods": {"/a.B/C": "llm", "/a.B/D": 1}}`, false, `methods["/a.B/D"]: got JSON number, want a string`},
		{"method value object", `{"defaultService": "/a.B/D", "methods": {"/a.B/D": "llm", "/a.B/E": {}}}`, false, `methods["/a.B/E"]: got JSON object, want a string`},
		{"unknown service", `{"methods": {"/a.B/C": "vision"}}`, false, `methods["/a.B/C"]: unknown service "vision"`},
		// Each report would be stale before the next arrived.
		{"OOB interval past the telemetry age", `{"orca": {"outOfBand": true, "interval": "45s"}}`, false, "orca.interval: 45s is longer than balancer.telemetryMaxAge (30s)"},
		{"default OOB interval past a set telemetry age", `{"orca": {"outOfBand": true}, "balancer": {"telemetryMaxAge": "5s"}}`, false, "orca.interval: the default 10s (DefaultOOBInterval: none given) is longer than balancer.telemetryMaxAge (5s), after which a report is ignored as stale: give a shorter one or raise telemetryMaxAge"},
		{"OOB interval past a set telemetry age", `{"orca": {"outOfBand": true, "interval": "15s"}, "balancer": {"telemetryMaxAge": "10s"}}`, false, "orca.interval: 15s is longer than balancer.telemetryMaxAge (10s)"},
		// Read as unknown, it would override defaultService for the entry.
		{"null service", `{"defaultService": "llm", "methods": {"/a.B/": null}}`, false, `methods["/a.B/"]: want llm, embedding, rerank or unknown`},
		{"empty service", `{"methods": {"/a.B/C": " "}}`, false, `methods["/a.B/C"]: want llm`},
		{"method without slash", `{"methods": {"a.B/C": "llm"}}`, false, `methods["a.B/C"]`},
		{"method too deep", `{"methods": {"/a.B/C/D": "llm"}}`, false, `methods["/a.B/C/D"]`},
		{"method empty service", `{"methods": {"//C": "llm"}}`, false, `methods["//C"]`},
		// No call's method has one: the entry would never match.
		{"method with a trailing space", `{"methods": {"/a.B/C ": "llm"}}`, false, `methods["/a.B/C "]`},
		{"method with a tab", `{"methods": {"/a.B/\tC": "llm"}}`, false, `methods["/a.B/\tC"]`},
		{"cooldown cap below the cooldown", `{"balancer": {"defaultCooldown": "1m", "maxCooldown": "10s"}}`, false, "balancer.maxCooldown: must be at least balancer.defaultCooldown (1m0s)"},
		{"not-served memory too long", `{"balancer": {"notServedMemory": "48h"}}`, false, "notServedMemory"},
		{"ejection cap below the ejection", `{"balancer": {"ejectionTime": "1m", "maxEjectionTime": "10s"}}`, false, "balancer.maxEjectionTime: must be at least balancer.ejectionTime (1m0s)"},
		{"bad default service", `{"defaultService": "images"}`, false, "defaultService"},
		{"bad header", `{"affinityKeyHeader": "x session"}`, false, "affinityKeyHeader"},
		{"reserved header", `{"tenantHeader": "grpc-tenant"}`, false, "tenantHeader"},
		{"bad model header", `{"modelHeader": "é"}`, false, "modelHeader"},
		{"idByHost as string", `{"idByHost": "yes"}`, false, "idByHost"},
		{"seed outside the section", `{"affinitySeed": 1}`, false, `unknown field "affinitySeed"`},
		// A section with an unknown field of its own is not where the
		// reported one is: "balancer.slowStartWindow" exists.
		{"tunable outside the section, and a typo in it", `{"slowStartWindow": "30s", "balancer": {"errorAlfa": 0.1}}`, false, `unknown field "slowStartWindow"`},
		{"unknown field, and another in orca", `{"oob": true, "orca": {"x": true}}`, false, `unknown field "oob"`},
		{"unknown balancer field after an orca one", `{"orca": {"oob": true}, "balancer": {"errorAlfa": 0.1}}`, false, `unknown field "orca.oob"`},
		{"unknown field in the second section", `{"balancer": {"oob": true}, "orca": {"x": 1}}`, false, `unknown field "balancer.oob"`},
		{"negative seed", `{"balancer": {"affinitySeed": -1}}`, false, "balancer.affinitySeed"},
		{"seed as string", `{"balancer": {"affinitySeed": "42"}}`, false, "balancer.affinitySeed"},
		{"affinity mode", `{"balancer": {"affinity": "sticky"}}`, false, `balancer.affinity: affinity mode "sticky"`},
		{"load bound", `{"balancer": {"loadBound": 0.5}}`, false, "balancer.loadBound"},
		{"key reuse above 1", `{"balancer": {"minKeyReuse": 2}}`, false, "balancer.minKeyReuse"},
		{"key reuse as string", `{"balancer": {"minKeyReuse": "5%"}}`, false, "balancer.minKeyReuse"},
		{"adapter homes as string", `{"balancer": {"adapterHomes": "half"}}`, false, "balancer.adapterHomes"},
		{"tenant shard too large", `{"balancer": {"tenantShardSize": 33}}`, false, "balancer.tenantShardSize"},
		{"sticky TTL not a duration", `{"balancer": {"stickyTTL": "2 minutes"}}`, false, "balancer.stickyTTL"},
		{"sticky entries negative", `{"balancer": {"stickyEntries": -1}}`, false, "balancer.stickyEntries: -1 must be in [0, 1048576] (0 means the default)"},
		{"scan limit too large", `{"balancer": {"scanLimit": 5000}}`, false, "balancer.scanLimit"},
		{"scan limit as string", `{"balancer": {"scanLimit": "all"}}`, false, "balancer.scanLimit"},
		{"sticky entries too many", `{"balancer": {"stickyEntries": 100000000}}`, false, "balancer.stickyEntries"},
		// Allocated up front by every channel: a service config (which a
		// resolver may push to every client) gets at most 32 MiB of it.
		{"sticky entries past the config's bound", `{"balancer": {"stickyEntries": 16777216}}`, false, "balancer.stickyEntries"},
		{"tenant shard negative", `{"balancer": {"tenantShardSize": -2}}`, false, "balancer.tenantShardSize"},
		{"strict tenant shards without shards", `{"balancer": {"tenantShardStrict": true}}`, false, "balancer.tenantShardStrict: needs balancer.tenantShardSize > 0"},
		{"strict tenant shards not a bool", `{"balancer": {"tenantShardSize": 4, "tenantShardStrict": "yes"}}`, false, "balancer.tenantShardStrict"},
		{"tenant shard not a number", `{"balancer": {"tenantShardSize": "4"}}`, false, "balancer.tenantShardSize"},
		{"tenant shard fractional", `{"balancer": {"tenantShardSize": 2.5}}`, false, "balancer.tenantShardSize: got JSON number 2.5, want an integer"},
		{"count too large", `{"balancer": {"breakerFailures": 1e30}}`, false, "balancer.breakerFailures: JSON number 1e30 is out of range (an integer, at most 2^63-1"},
		{"number too large", `{"balancer": {"errorAlpha": 1e400}}`, false, "balancer.errorAlpha: JSON number 1e400 is out of range (a number, at most about 1.8e308"},
		{"seed past 2^64", `{"balancer": {"affinitySeed": 18446744073709551616}}`, false, "balancer.affinitySeed: JSON number 18446744073709551616 is out of range (an integer from 0 to 2^64-1)"},
		{"bad interval", `{"orca": {"interval": "soon"}}`, false, "orca.interval"},
		{"zero interval", `{"orca": {"interval": "0s"}}`, false, "orca.interval"},
		{"perCall type", `{"orca": {"perCall": "yes"}}`, false, "orca.perCall"},
		{"bad duration", `{"balancer": {"latencyDecay": "10"}}`, false, "balancer.latencyDecay"},
		{"bad spill memory", `{"balancer": {"spillMemory": "forever"}}`, false, "balancer.spillMemory"},
		{"duration as number", `{"balancer": {"errorDecay": 30}}`, false, "balancer.errorDecay"},
		{"negative decay", `{"balancer": {"latencyDecay": "-1s"}}`, false, "balancer.latencyDecay"},
		{"alpha above 1", `{"balancer": {"errorAlpha": 2}}`, false, "balancer.errorAlpha"},
		{"panic above 1", `{"balancer": {"panicThreshold": 1.5}}`, false, "balancer.panicThreshold"},
		{"min weight", `{"balancer": {"slowStartMinWeight": -0.1}}`, false, "balancer.slowStartMinWeight"},
		{"retry ratio", `{"balancer": {"retryRatio": 3}}`, false, "balancer.retryRatio"},
		{"probes", `{"balancer": {"breakerProbes": -2}}`, false, "balancer.breakerProbes"},
		{"ejected fraction", `{"balancer": {"maxEjectedFraction": 1.2}}`, false, "balancer.maxEjectedFraction"},
		{"negative cooldown", `{"balancer": {"defaultCooldown": "-1s"}}`, false, "balancer.defaultCooldown"},
		{"duration under a millisecond", `{"balancer": {"stickyTTL": "500us"}}`, false, "balancer.stickyTTL: balancer.Options.StickyTTL = 500µs: must be 0 (the default) or at least 1ms"},
		{"tunables on a shared Balancer", `{"balancer": {}}`, true, "field balancer: not allowed"},
		{"method with a wildcard", `{"methods": {"/ai.Gen/*": "llm"}}`, false, `methods["/ai.Gen/*"]: no wildcards: "/package.Service/" covers every method of a service`},
		{"service with a wildcard", `{"methods": {"/ai.*/Embed": "embedding"}}`, false, `methods["/ai.*/Embed"]: no wildcards`},
		{"duration past its range", `{"balancer": {"latencyDecay": "3000000h"}}`, false, `balancer.latencyDecay: "3000000h" is out of range: a duration may be at most 2562047h47m16.854775807s`},
		{"negative duration past its range", `{"balancer": {"latencyDecay": "-1.5e9h"}}`, false, `balancer.latencyDecay: "-1.5e9h" is not a duration`},
		{"duration of many parts past its range", `{"balancer": {"latencyDecay": "2000000h.5s3000000h"}}`, false, `"2000000h.5s3000000h" is out of range`},
		{"duration with a word for a unit", `{"balancer": {"latencyDecay": "3000000hours"}}`, false, `balancer.latencyDecay: "3000000hours" is not a duration`},
		{"interval past its range", `{"orca": {"interval": "1.5s9999999999h"}}`, false, `orca.interval: "1.5s9999999999h" is out of range`},
		{"duration with a unit missing", `{"orca": {"interval": "1.5s20"}}`, false, `orca.interval: "1.5s20" is not a duration`},
		{"duration with a dot alone", `{"balancer": {"latencyDecay": ".s"}}`, false, `balancer.latencyDecay: ".s" is not a duration`},
		{"duration of a sign alone", `{"balancer": {"latencyDecay": "-"}}`, false, `balancer.latencyDecay: "-" is not a duration`},
		{"duration in days", `{"balancer": {"latencyDecay": "1d"}}`, false, `balancer.latencyDecay: "1d" is not a duration`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var shared *core.Balancer
			if tt.shared {
				shared = coreForTest()
			}
			_, err := parseConfig([]byte(tt.js), shared)
			if err == nil {
				t.Fatalf("parseConfig(%s) succeeded", tt.js)
			}
			if !strings.HasPrefix(err.Error(), "inferlb: ") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("parseConfig(%s) = %q, want the inferlb prefix and %q", tt.js, err, tt.want)
			}
		})
	}
}

// The core's hint for Go callers, that a bare number in a time.Duration is
// nanoseconds, does not fit a service config, whose durations are strings
// with a unit and refuse a bare number: an error read "500µs: must be ...
// at least 1ms (a bare number is nanoseconds)" for "500us".
func TestParseConfigDurationErrorHasNoGoHint(t *testing.T) {
	_, err := parseConfig([]byte(`{"balancer": {"stickyTTL": "500us"}}`), nil)
	if err == nil || strings.Contains(err.Error(), "nanoseconds") {
		t.Fatalf("parseConfig = %v, want an error without the Go hint", err)
	}
}

func TestParseConfigThroughBuilder(t *testing.T) {
	if _, err := (&Builder{name: Name}).ParseConfig([]byte(`{"balancer": {"errorAlpha": 0.3}}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := NewBuilder("x", coreForTest()).ParseConfig([]byte(`{"balancer": {"errorAlpha": 0.3}}`)); err == nil {
		t.Fatal("a NewBuilder policy accepted tunables it cannot apply")
	}
}

// FuzzParseConfig: a service config is operator input that may come from
// a DNS TXT record or a control plane. Whatever the bytes, parsing returns
// either an error carrying the package prefix or a config whose options
// the core accepts and can build a Balancer from; never a panic, and the
// same bytes always parse the same way (the whole config, not a few
// fields). An error names the field at fault, or says the bytes are no
// JSON object: well-formed JSON is never refused without a field named.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		``, `{}`, `{"methods": {"/ai.Gen/": "llm", "/ai.Gen/Embed": "embedding"}, "defaultService": "rerank"}`,
		`{"affinityKeyHeader": "X-Session-Id", "tenantHeader": "x-tenant", "modelHeader": "x-model"}`,
		`{"orca": {"perCall": false, "outOfBand": true, "interval": "2s"}}`,
		`{"balancer": {"affinity": "strict", "loadBound": 1.5, "tenantShardSize": 4, "spillMemory": "30s", "minKeyReuse": 0.1}}`,
		`{"balancer": {"latencyDecay": "-1s", "errorAlpha": 2}}`, `{"methods": {"//C": "llm"}}`, `{} {}`, `[`,
		`"x"`, `null`, `{"methods": 3}`, `{"methods": {"/a.B/C": 3}}`, `{"balancer": {"breakerFailures": 2.5}}`,
		`{"orca": {"interval": 5}}`, `{"balancer": {"affinitySeed": -1}}`, `{"balancer": {"oops": 1}}`,
		`{"endpoints": {"10.0.0.1:80": {"id": "a", "weight": 2, "labels": {"model": "m", "dp_group": 0}}, "LLM:080": {"Labels": {"v\u0001": "x"}}}}`,
	} {
		f.Add([]byte(s), false)
	}
	sharedCore := coreForTest()
	f.Fuzz(func(t *testing.T, js []byte, isShared bool) {
		var shared *core.Balancer
		if isShared {
			shared = sharedCore
		}
		c, err := parseConfig(js, shared)
		if err != nil {
			msg := err.Error()
			switch {
			case strings.HasPrefix(msg, "inferlb: service config field "),
				strings.HasPrefix(msg, "inferlb: service config: unknown field "):
			case !json.Valid(js) && (strings.HasPrefix(msg, "inferlb: service config: invalid JSON") ||
				msg == "inferlb: service config: unexpected data after the JSON object"):
			default:
				t.Fatalf("parseConfig(%q): error %q names no field (json.Valid %v)", js, err, json.Valid(js))
			}
			return
		}
		if err := c.opts.Validate(); err != nil {
			t.Fatalf("parseConfig(%q) accepted options the core rejects: %v", js, err)
		}
		if isShared && c.hasTunables {
			t.Fatalf("parseConfig(%q) accepted tunables for a shared Balancer", js)
		}
		if c.oobInterval <= 0 {
			t.Fatalf("parseConfig(%q): OOB interval %v", js, c.oobInterval)
		}
		_ = core.New(c.opts) // must not panic
		again, err := parseConfig(js, shared)
		if err != nil || !reflect.DeepEqual(again, c) {
			t.Fatalf("parseConfig(%q) is not deterministic: %v\n%+v\n%+v", js, err, c, again)
		}
	})
}

// TestParseConfigDuplicateKeys: encoding/json lets a repeated key win
// silently (and merges repeated objects), so an operator who names a method
// or a tunable twice gets whichever came last. The parser refuses, naming
// the field. encoding/json matches field names case-insensitively, so a
// field spelt twice in different cases is a repeat too; method names are
// case-sensitive in gRPC, so those are not.
func TestParseConfigDuplicateKeys(t *testing.T) {
	tests := []struct {
		name string
		js   string
		want string // substring of the error
	}{
		{"top-level field", `{"defaultService": "llm", "defaultService": "embedding"}`, "field defaultService: duplicate key"},
		{"methods twice", `{"methods": {"/a.B/C": "llm"}, "methods": {"/a.B/D": "embedding"}}`, "field methods: duplicate key"},
		{"method twice", `{"methods": {"/a.B/C": "llm", "/a.B/D": "llm", "/a.B/C": "embedding"}}`, `field methods["/a.B/C"]: duplicate key`},
		{"service prefix twice", `{"methods": {"/a.B/": "llm", "/a.B/": "llm"}}`, `field methods["/a.B/"]: duplicate key`},
		{"field in another case", `{"idByHost": false, "IDBYHOST": true}`, `field idByHost: duplicate key "IDBYHOST"`},
		{"field in a folded case", `{"methods": {}, "methodſ": {"/a.B/C": "llm"}}`, `field methods: duplicate key "methodſ"`},
		{"field with a Kelvin sign", `{"balancer": {"breakerFailures": 1, "brea\u212aerFailures": 2}}`, "field balancer.breakerFailures: duplicate key \"brea\u212aerFailures\""},
		{"orca twice", `{"orca": {"outOfBand": true}, "orca": {"interval": "1s"}}`, "field orca: duplicate key"},
		{"orca field twice", `{"orca": {"perCall": false, "perCall": true}}`, "field orca.perCall: duplicate key"},
		{"tunable twice", `{"balancer": {"errorAlpha": 0.1, "loadBound": 2, "errorAlpha": 0.5}}`, "field balancer.errorAlpha: duplicate key"},
		{"balancer twice", `{"balancer": {}, "balancer": {}}`, "field balancer: duplicate key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseConfig([]byte(tt.js), nil)
			if err == nil {
				t.Fatalf("parseConfig(%s) succeeded", tt.js)
			}
			if !strings.HasPrefix(err.Error(), "inferlb: ") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("parseConfig(%s) = %q, want the inferlb prefix and %q", tt.js, err, tt.want)
			}
		})
	}
	// Not repeats: the same key in different objects, and methods whose
	// names differ only in case.
	for _, js := range []string{
		`{"methods": {"/a.B/C": "llm", "/a.b/C": "llm", "/a.B/c": "llm"}, "orca": {"perCall": true}}`,
		`{"orca": {"interval": "1s"}, "balancer": {"latencyDecay": "1s", "errorDecay": "1s"}}`,
	} {
		if _, err := parseConfig([]byte(js), nil); err != nil {
			t.Errorf("parseConfig(%s): %v", js, err)
		}
	}
}
