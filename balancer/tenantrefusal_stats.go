package balancer

import "sync/atomic"

// What the tenants' refusals memory (tenantrefusal.go) shows operators:
// per endpoint, how many tenants' calls it passes the endpoint over for
// (EndpointStats.RefusedTenants). The pairs' words hold a tag of
// (endpoint, tenant), not the endpoint, so each pair's slot has the serial
// of its endpoint beside it (owners), written with the word under mu.
// Stats reads them; Pick never does.

// own notes serial as the endpoint of the pair of key pk whose entry slot
// s, one of the two sets lackSet gives pk in t.pairs, is about to hold,
// and bkt as its tenant's bucket (refusalTable.marks), and returns the
// slot's index. Called with mu held.
func (t *refusalTable) own(pk uint64, s *atomic.Uint64, serial uint64, bkt int) int {
	n := uint64(refusalPairs / lackWays)
	for _, base := range [2]int{int(pk%n) * lackWays, int(pk>>lackAltShift%n) * lackWays} {
		for i := base; i < base+lackWays; i++ {
			if &t.pairs[i] == s {
				t.owners[i].Store(serial)
				t.bucket[i] = uint8(bkt)
				return i
			}
		}
	}
	panic("inferlb: pair entry outside its sets")
}

// refusedTenants returns, by endpoint serial, the number of tenants whose
// calls the memory passes the endpoint over for at nowNs: its live pairs
// whose run of refusals marked them, with the pass-over in force (as
// marked reads it). It is nil while nothing is remembered. It scans the
// table under mu, so that each pair's word and serial agree: for Stats,
// never for a pick.
//
// A pick still takes a counted endpoint when passing over every endpoint
// so marked for the tenant would hold out more of the pool than
// MaxEjectedFraction, or leave no candidate (tenantMarks); a tenant's
// pairs whose own entry was evicted (by a flood of refused tenants,
// before one of its calls was served elsewhere) pass nothing over, and
// are counted until they lapse.
func (b *Balancer) refusedTenants(nowNs int64) map[uint64]int {
	t := b.refused.Load()
	if t == nil || b.refusedAt.Load() <= nowNs {
		return nil
	}
	now := lackNow(nowNs)
	var out map[uint64]int
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range t.pairs {
		w := t.pairs[i].Load()
		if w == 0 || w&refusalMarked == 0 || lackLapsed(w, now, t.horizon) || w&lackTimeMask <= now+t.hold {
			continue
		}
		if out == nil {
			out = map[uint64]int{}
		}
		out[t.owners[i].Load()]++
	}
	return out
}
