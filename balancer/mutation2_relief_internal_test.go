package balancer

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/telemetry"
)

// A pressured owner (KV cache from pressureSpill) looks for relief up to
// pressureLook (4) endpoints along its key's order, at one whose fresh
// pressure is known and at least pressureMargin (0.2) under its own, with
// no queue; finding none it keeps the key. kv gives each rank's KV-cache
// usage (no queue); a negative one publishes nothing for that rank.
func TestPressuredOwnerLooksForReliefAlongItsOrder(t *testing.T) {
	const owner = 0.97
	for _, tc := range []struct {
		name string
		kv   []float64 // by rank in the key's order
		want int       // rank the key goes to
	}{
		{"relief at the 4th", []float64{owner, owner, owner, owner, 0.2, 0.2, 0.2, 0.2}, 4},
		{"relief only at the 5th", []float64{owner, owner, owner, owner, owner, 0.2, 0.2, 0.2}, 0},
		{"unknown pressure is no relief", []float64{owner, -1, 0.2, owner, owner, owner, owner, owner}, 2},
		{"a margin of 0.12 is not clearly less", []float64{owner, owner - 0.12, 0.2, owner, owner, owner, owner, owner}, 2},
		{"a margin of exactly pressureMargin is", []float64{owner, owner - pressureMargin, 0.2, owner, owner, owner, owner, owner}, 1},
		{"pressured from exactly pressureSpill", []float64{pressureSpill, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newStayRig(t, 8, Options{})
			for rank, kv := range tc.kv {
				if kv < 0 {
					continue
				}
				s := telemetry.Sample{Time: r.clock.Now()}
				s.Set(telemetry.Waiting, 0)
				s.Set(telemetry.KVCacheUsage, kv)
				r.b.Publish(r.g.members[r.order[rank]].id, s)
			}
			p, err := r.b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: stayKey})
			if err != nil {
				t.Fatal(err)
			}
			got := r.rankOf(p.ID())
			p.Done(inferlb.Outcome{})
			assert.Equal(t, tc.want, got, fmt.Sprintf("KV by rank %v", tc.kv))
		})
	}
}
