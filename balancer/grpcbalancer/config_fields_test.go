package grpcbalancer

import (
	"reflect"
	"strings"
	"testing"
)

// TestParseConfigNamesEachField: a value of the wrong JSON type in any
// field of the service config, and a value a field's rule refuses, fail
// with an error that names the field as written in the config, for every
// field (found by reflection, so a new one is covered as it is added).
func TestParseConfigNamesEachField(t *testing.T) {
	check := func(t *testing.T, js, field string) {
		t.Helper()
		_, err := parseConfig([]byte(js), nil)
		if err == nil {
			t.Fatalf("parseConfig(%s) succeeded", js)
		}
		if !strings.HasPrefix(err.Error(), "inferlb: ") || !strings.Contains(err.Error(), field+":") {
			t.Errorf("parseConfig(%s) = %q, want the inferlb prefix and %q", js, err, field+":")
		}
	}
	tags := func(v any) []string {
		var out []string
		typ := reflect.TypeOf(v)
		for i := range typ.NumField() {
			out = append(out, strings.Split(typ.Field(i).Tag.Get("json"), ",")[0])
		}
		return out
	}
	// An array is the wrong type for every field.
	for _, tag := range tags(jsonConfig{}) {
		check(t, `{"`+tag+`": [1]}`, tag)
	}
	for _, tag := range tags(jsonORCA{}) {
		check(t, `{"orca": {"`+tag+`": [1]}}`, "orca."+tag)
	}
	for _, tag := range tags(jsonTunables{}) {
		check(t, `{"balancer": {"`+tag+`": [1]}}`, "balancer."+tag)
	}
	for _, tag := range tags(jsonEndpoint{}) {
		check(t, `{"endpoints": {"10.0.0.1:80": {"`+tag+`": [1]}}}`, `endpoints["10.0.0.1:80"].`+tag)
	}
	// A value of a map field names its key.
	check(t, `{"methods": {"/a.B/C": [1]}}`, `methods["/a.B/C"]`)
	check(t, `{"endpoints": {"10.0.0.1:80": {"labels": {"model": [1]}}}}`, `endpoints["10.0.0.1:80"].labels["model"]`)

	// Values of the right type that a field's rule refuses, one or more
	// per tunable with a rule; the others take any value of their type.
	ruled := map[string][]string{
		"telemetryMaxAge":     {`"soon"`, `"1ns"`},
		"latencyDecay":        {`"-1s"`},
		"errorAlpha":          {`1.5`, `-0.1`},
		"errorDecay":          {`"-1s"`},
		"panicThreshold":      {`1.5`},
		"defaultCooldown":     {`"-1s"`},
		"maxCooldown":         {`"-1s"`},
		"notServedMemory":     {`"25h"`},
		"slowStartWindow":     {`"30"`},
		"slowStartMinWeight":  {`1.5`, `-0.1`},
		"slowStartAggression": {`-1`},
		"retryRatio":          {`1.5`},
		"retryFloor":          {`1e400`},
		"affinity":            {`"sometimes"`},
		"loadBound":           {`1`, `0.5`},
		"affinitySeed":        {`-1`},
		"tenantShardSize":     {`-1`, `33`},
		"tenantShardStrict":   {`true`},
		"spillMemory":         {`"a while"`},
		"minKeyReuse":         {`1.5`},
		"adapterHomes":        {`1e400`},
		"scanLimit":           {`1`, `1025`},
		"breakerFailures":     {`4294967296`},
		"breakerProbes":       {`-1`},
		"ejectionTime":        {`"-1s"`, `"10ns"`},
		"maxEjectionTime":     {`"-1s"`},
		"maxEjectedFraction":  {`1.5`},
		"outlierInterval":     {`"often"`},
		"outlierMinRequests":  {`-1`},
		"outlierMargin":       {`1.5`},
		"stickyTTL":           {`"5 minutes"`},
		"stickyEntries":       {`-1`},
		// One label cannot list models and name engines (the other's
		// default, here).
		"subsetLabel":  {`"dp_group"`},
		"dpGroupLabel": {`"model"`},
	}
	anyValue := map[string]bool{}
	for _, tag := range tags(jsonTunables{}) {
		if len(ruled[tag]) == 0 == !anyValue[tag] {
			t.Errorf("balancer.%s: give it a refused value here, or list it as taking any value", tag)
		}
		for _, v := range ruled[tag] {
			check(t, `{"balancer": {"`+tag+`": `+v+`}}`, "balancer."+tag)
		}
	}
	check(t, `{"balancer": {"subsetLabel": "pool", "dpGroupLabel": "pool"}}`, "balancer.subsetLabel")
	if _, err := parseConfig([]byte(`{"balancer": {"subsetLabel": "pool", "dpGroupLabel": "engine"}}`), nil); err != nil {
		t.Errorf("distinct labels: %v", err)
	}
	for _, js := range []string{
		`{"orca": {"interval": "0s"}}`,
		`{"orca": {"interval": "-5s"}}`,
		`{"orca": {"outOfBand": true, "interval": "1m"}}`,
	} {
		check(t, js, "orca.interval")
	}
}
