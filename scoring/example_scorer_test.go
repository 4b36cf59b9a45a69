package scoring_test

import (
	"fmt"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/scoring"
)

// tokenLoad prices a generation endpoint by the tokens this process has
// in flight there per unit of its capacity, for a workload whose calls
// differ so much in length that counting calls misleads.
type tokenLoad struct {
	// Floor is the tokens an idle endpoint counts as holding. It keeps
	// every cost above 0: the balancer raises a cost by multiplying it
	// (its price of a recent long prompt, say), and 0 times anything is 0.
	Floor float64
}

var _ scoring.Scorer = (*tokenLoad)(nil)

// Cost is a pure function of the request and the snapshot: no I/O, no
// locks, no allocation. State.Weight is always above 0.
func (t *tokenLoad) Cost(_ *inferlb.Request, s scoring.State) float64 {
	return (float64(max(s.InFlightTokens, 0)) + t.Floor) / s.Weight
}

// Validate is found by the balancer, which calls it when it is built: a
// bad setting fails there, naming the field, not on the first pick.
func (t *tokenLoad) Validate() error {
	if !(t.Floor > 0) { // NaN too
		return fmt.Errorf("tokenLoad.Floor = %v: must be above 0", t.Floor)
	}
	return nil
}

// A Scorer of your own, written from scratch: a cost (lower wins) from the
// State the balancer hands it, and a Validate method the balancer calls
// at construction. Here generation calls go where the fewest tokens are
// in flight, so the calls that follow one long call go elsewhere.
func ExampleScorer() {
	bad := balancer.Options{Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceLLM: &tokenLoad{}}}
	fmt.Println(bad.Validate())

	b := balancer.New(balancer.Options{Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceLLM: &tokenLoad{Floor: 1000}}})
	defer b.Close()
	if err := b.Update([]inferlb.Endpoint{{Addr: "10.0.0.1:8000"}, {Addr: "10.0.0.2:8000"}}); err != nil {
		panic(err)
	}
	long, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 30000, MaxOutputTokens: 2000})
	if err != nil {
		panic(err)
	}
	elsewhere := 0
	var short []balancer.Pick
	for range 5 {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 500, MaxOutputTokens: 200})
		if err != nil {
			panic(err)
		}
		if p.Endpoint().Addr != long.Endpoint().Addr {
			elsewhere++
		}
		short = append(short, p)
	}
	fmt.Printf("short calls sent to the other endpoint: %d of 5\n", elsewhere)

	for _, p := range short {
		p.Done(inferlb.Outcome{})
	}
	long.Done(inferlb.Outcome{})
	// Output:
	// inferlb: balancer.Options.Scorers[llm]: tokenLoad.Floor = 0: must be above 0
	// short calls sent to the other endpoint: 5 of 5
}
