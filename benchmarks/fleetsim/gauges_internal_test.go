package fleetsim

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/telemetry"
)

// oneCall submits one long call at a fixed instant.
type oneCall struct{ at time.Duration }

func (w oneCall) Start(s Sim) {
	s.After(w.at, func() {
		s.Submit(&Request{
			Service: inferlb.ServiceLLM, Model: Model,
			Prompt:       NewPrompt(Segment{contentID(1, 99, 0), 4000}),
			OutputTokens: 2000, MaxOutputTokens: 2000, AnswerID: contentID(3, 99, 0),
		})
	})
}

func (oneCall) Done(Sim, *Request, bool) {}

// scrapeRecorder records the scrapes published to it.
type scrapeRecorder struct {
	Router
	got *[]telemetry.Sample
}

func (r *scrapeRecorder) Publish(_ int, s telemetry.Sample) { *r.got = append(*r.got, s) }

// A scrape reads the gauges as of the end of the replica's last engine
// step, as vLLM updates them after each step: a call that arrives 10 ms
// before a scrape, at an idle replica whose first step (its prefill)
// takes longer, does not show in it; the next scrape shows it running.
func TestScrapeReadsTheLastCompletedStep(t *testing.T) {
	sc := ChatScenario()
	sc.Fleet = sc.Fleet[:1]
	sc.Workload = func(float64) Workload { return oneCall{at: 990 * time.Millisecond} }
	var got []telemetry.Sample
	pol := Policy{Name: "recorder", New: func(e Env) Router {
		return &scrapeRecorder{Router: RoundRobin().New(e), got: &got}
	}}
	Run(sc, pol, RunConfig{Rate: 1, Clients: 1, Seed: 1, Warmup: 0, Duration: 3 * time.Second, Drain: 5 * time.Second, Scrape: time.Second})
	at := func(d time.Duration) telemetry.Sample {
		for _, s := range got {
			if s.Time.Equal(Epoch.Add(d)) {
				return s
			}
		}
		require.FailNow(t, "no scrape", "at %v", d)
		return telemetry.Sample{}
	}
	field := func(s telemetry.Sample, f telemetry.Field) float64 {
		v, ok := s.Get(f)
		require.True(t, ok)
		return v
	}
	first, second := at(time.Second), at(2*time.Second)
	assert.Zero(t, field(first, telemetry.Running), "10 ms after the call arrived, mid-prefill")
	assert.Zero(t, field(first, telemetry.Waiting))
	assert.Zero(t, field(first, telemetry.KVCacheUsage))
	assert.Equal(t, 1.0, field(second, telemetry.Running), "a second later, decoding")
	assert.Positive(t, field(second, telemetry.KVCacheUsage))
}
