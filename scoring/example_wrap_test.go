package scoring_test

import (
	"fmt"
	"time"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/scoring"
)

// zoneFirst prices an endpoint outside the caller's zone (its "zone" label)
// at Penalty times the latency scorer's cost. It embeds *scoring.Latency:
// its own Cost replaces Latency's, and Latency's FullScan is kept, so the
// balancer still compares every endpoint for these calls.
type zoneFirst struct {
	*scoring.Latency
	Zone    string
	Penalty float64
}

func (z zoneFirst) Cost(req *inferlb.Request, s scoring.State) float64 {
	c := z.Latency.Cost(req, s)
	if s.Endpoint.Labels["zone"] != z.Zone {
		c *= z.Penalty
	}
	return c
}

// zoneFirstField holds the scorer it wraps in a field instead: its Cost is
// the same, but it has no FullScan, so the balancer compares two endpoints
// drawn at random for its calls, as for a generation.
type zoneFirstField struct {
	inner   scoring.Scorer
	zone    string
	penalty float64
}

func (z zoneFirstField) Cost(req *inferlb.Request, s scoring.State) float64 {
	c := z.inner.Cost(req, s)
	if s.Endpoint.Labels["zone"] != z.zone {
		c *= z.penalty
	}
	return c
}

// A Scorer of your own, for one service, wrapping a built-in one: here
// embeddings still priced by latency, with endpoints in another zone
// priced at twice theirs. Wrap a built-in scorer by embedding it, so that
// what the balancer reads from its type (scoring.FullScanner) stays.
func Example_wrap() {
	emb := zoneFirst{Latency: &scoring.Latency{}, Zone: "us-east-1a", Penalty: 2}
	field := zoneFirstField{inner: &scoring.Latency{}, zone: "us-east-1a", penalty: 2}
	for _, s := range []scoring.Scorer{emb, field} {
		fs, ok := s.(scoring.FullScanner)
		fmt.Printf("%T compares every endpoint: %v\n", s, ok && fs.FullScan())
	}

	// One endpoint in the caller's zone, three in another, all answering
	// in 20 ms. Comparing every endpoint, each call goes to the local one;
	// two drawn at random include it in half the picks.
	eps := []inferlb.Endpoint{{Addr: "10.0.0.5:8080", Labels: map[string]string{"zone": "us-east-1a"}}}
	for i := range 3 {
		eps = append(eps, inferlb.Endpoint{Addr: fmt.Sprintf("10.1.0.%d:8080", i+5), Labels: map[string]string{"zone": "us-east-1b"}})
	}
	for _, s := range []scoring.Scorer{emb, field} {
		b := balancer.New(balancer.Options{Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceEmbedding: s}})
		if err := b.Update(eps); err != nil {
			panic(err)
		}
		local := 0
		for i := range 8 + 100 { // the first two calls to each endpoint measure it
			p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding})
			if err != nil {
				panic(err)
			}
			if i >= 8 && p.Endpoint().Labels["zone"] == "us-east-1a" {
				local++
			}
			p.Done(inferlb.Outcome{Latency: 20 * time.Millisecond})
		}
		b.Close()
		fmt.Printf("%T: all 100 calls local: %v\n", s, local == 100)
	}
	// Output:
	// scoring_test.zoneFirst compares every endpoint: true
	// scoring_test.zoneFirstField compares every endpoint: false
	// scoring_test.zoneFirst: all 100 calls local: true
	// scoring_test.zoneFirstField: all 100 calls local: false
}
