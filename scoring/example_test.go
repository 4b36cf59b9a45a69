package scoring_test

import (
	"fmt"
	"time"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/scoring"
	"github.com/inferlb/inferlb/telemetry"
)

// Tune a service's scorer and give it to the Balancer; zero fields keep
// their defaults. The Balancer validates every Scorer it is given, so a
// setting that cannot be meant (a knee of 85 for 85%) fails at New, and
// Options.Validate reports it first.
func ExampleLLM() {
	llm := &scoring.LLM{KVKnee: 0.80} // KV-cache pressure from 80% instead of 85%
	opts := balancer.Options{Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceLLM: llm}}
	if err := opts.Validate(); err != nil {
		fmt.Println(err)
		return
	}
	b := balancer.New(opts)
	defer b.Close()

	// What the balancer weighs for two idle endpoints, one of them with
	// its KV cache 90% full: 1 + Steepness x (0.90 - KVKnee) / (1 - 0.90)
	// times the other's (3x at the default knee; MaxKVPressure caps it).
	req := &inferlb.Request{Service: inferlb.ServiceLLM}
	idle := scoring.State{Weight: 1, Now: time.Now()}
	full := idle
	full.Telemetry.Set(telemetry.KVCacheUsage, 0.90)
	fmt.Printf("full / idle: %.0fx\n", llm.Cost(req, full)/llm.Cost(req, idle))

	bad := balancer.Options{Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceLLM: &scoring.LLM{KVKnee: 85}}}
	fmt.Println(bad.Validate())
	// Output:
	// full / idle: 5x
	// inferlb: balancer.Options.Scorers[llm]: scoring.LLM.KVKnee = 85: must be in [0, 1] (0 means the default, 1 turns its factor off): invalid scorer setting
}
