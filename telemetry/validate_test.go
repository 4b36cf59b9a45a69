package telemetry_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/dcgm"
	"github.com/inferlb/inferlb/telemetry/modelserver"
	"github.com/inferlb/inferlb/telemetry/promapi"
)

// TestNewPollerValidatesTheSource: a misconfigured source fails when the
// Poller is built, naming the field, not at every round once it runs (where
// it is only a counted error, or a negative number quietly read as the
// default).
func TestNewPollerValidatesTheSource(t *testing.T) {
	byID := dcgm.ByHost(map[string]string{"node": "e0"})
	for _, tc := range []struct {
		name string
		src  telemetry.Source
		want string // "" for a valid source
	}{
		{"promapi without URL", &promapi.Source{}, "promapi: Source.URL is empty"},
		{"promapi with an empty query", &promapi.Source{URL: "http://prom:9090", Queries: map[telemetry.Field]string{telemetry.Waiting: " "}}, "Source.Queries[waiting] is empty"},
		{"promapi negative body bound", &promapi.Source{URL: "http://prom:9090", MaxBodyBytes: -1}, "promapi: Source.MaxBodyBytes is -1"},
		{"promapi", &promapi.Source{URL: "http://prom:9090"}, ""},
		{"modelserver negative parallelism", &modelserver.Source{Parallelism: -2}, "modelserver: Source.Parallelism is -2"},
		{"modelserver negative body bound", &modelserver.Source{MaxBodyBytes: -1}, "modelserver: Source.MaxBodyBytes is -1"},
		{"modelserver", &modelserver.Source{Targets: modelserver.Static()}, ""},
		{"modelserver target without ID", &modelserver.Source{Targets: modelserver.Static(modelserver.Target{URL: "http://a:8000/metrics"})}, "modelserver: target 0 (\"http://a:8000/metrics\"): EndpointID is empty"},
		{"modelserver target without scheme", &modelserver.Source{Targets: modelserver.Static(modelserver.Target{EndpointID: "a", URL: "a:8000/metrics"})}, "not an http or https URL"},
		{"modelserver targets", &modelserver.Source{Targets: modelserver.Static(modelserver.Target{EndpointID: "a", URL: "http://a:8000/metrics"})}, ""},
		{"dcgm URLs without Map", &dcgm.Source{URLs: []string{"http://node:9400/metrics"}}, "dcgm: Source.Map is nil and Source.URLs lists exporters"},
		{"dcgm empty URL", &dcgm.Source{URLs: []string{""}, Map: byID}, "dcgm: Source.URLs[0] is empty"},
		{"dcgm URL without scheme", &dcgm.Source{URLs: []string{"node:9400/metrics"}, Map: byID}, "not an http or https URL"},
		{"dcgm target without scheme", &dcgm.Source{Targets: dcgm.Static(dcgm.Target{URL: "node:9400", Map: byID})}, "not an http or https URL"},
		{"dcgm negative parallelism", &dcgm.Source{Parallelism: -1}, "dcgm: Source.Parallelism is -1"},
		{"dcgm", &dcgm.Source{URLs: []string{"http://node:9400/metrics"}, Map: byID}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := telemetry.NewPoller(tc.src, &recorder{}, telemetry.PollerOptions{})
			if tc.want == "" {
				require.NoError(t, err)
				assert.NotNil(t, p)
				return
			}
			require.ErrorContains(t, err, tc.want)
			assert.Contains(t, err.Error(), "telemetry: NewPoller: ")
			if strings.Contains(tc.name, "target") || strings.Contains(tc.name, "URL without scheme") {
				return // Collect reports a bad target as that target's failure, and reads the rest
			}
			// Collect says the same, before any request.
			_, err = tc.src.Collect(context.Background())
			assert.ErrorContains(t, err, tc.want)
		})
	}
}
