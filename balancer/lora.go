package balancer

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/inferlb/inferlb"
)

// LoRA adapter slots.
//
// vLLM runs at most --max-loras distinct LoRA adapters in one batch, and
// its scheduler holds a call for any other adapter until every running
// call of one of them has finished, however short its queue. A server
// reports its slots and the adapters it has running and waiting
// (telemetry.LoRASlots and telemetry.Sample.Adapters, from
// vllm:lora_requests_info). For a call that names an adapter, a member is
// full when its fresh reading, brought up to now with this process's own
// calls in flight there (below), has every slot taken by other adapters;
// a full member is
//
//   - out of bound for the call's affinity key (withinBound): the key
//     spills past it as past an owner over its load bound, since the
//     wait outlasts what a warm prefix saves;
//   - drawn again as a P2C candidate, up to slotRedraws times (drawSlot),
//     so both candidates are full only when nearly the whole group is
//     (with half the members full, one pick in sixty-four instead of one
//     in four), and the draw stays bounded when every member is full;
//     of a full candidate and one that is not, the other wins, whatever
//     their costs (the scorer sees the reading, not the calls since);
//   - priced by the scorer on the reading alone (scoring.LLM's LoRAWait;
//     LoRALoad for a member that would load the adapter into a free slot).
//
// A reading is as old as the last scrape, and adapters come and go by
// the second: a server whose scrape showed a free slot would take every
// adapter's calls until the next one. So each member counts this
// process's calls in flight there per adapter (loraFlight, up to
// loraFlights adapters, lock-free), and an adapter with calls in flight
// takes a slot (or, for its own calls, holds one) as the reading's
// running adapters do.
//
// All of it applies to a service whose scorer is a scoring.LLM that
// prices the wait (LoRAWait not 1). With no LoRA reading anywhere it
// costs a pick with a model one atomic load (Store.AdaptersObserved).

// slotRedraws is how many times a P2C candidate whose slots are full for
// the call's adapter is drawn again.
const slotRedraws = 2

// loraFlights is how many adapters a member counts calls in flight for; a
// call for another one while all are in use is not counted. It fits the
// 4 bits of Pick.flags that name the entry (pickLoRAShift).
const loraFlights = 8

// Pick.flags: the loraFlight entry the call counts in, plus one (0: none).
const (
	pickLoRAShift = 2
	pickLoRAMask  = 0xf << pickLoRAShift
)

// loraFlight counts this process's calls in flight on one member per
// LoRA adapter, without locks: each entry is one word, the adapter's
// tag (the high 32 bits of its modelID) and its count of calls. Two
// picks of a new adapter at once may each take an entry for it; readers
// count an adapter once however many entries hold it.
type loraFlight [loraFlights]atomic.Uint64

func loraTag(h uint64) uint64 { return h >> 32 << 32 }

// add counts a call of adapter h and returns its entry plus one, or 0
// when every entry holds another adapter's calls.
func (f *loraFlight) add(h uint64) uint32 {
	tag := loraTag(h)
	for i := range f {
		for {
			w := f[i].Load()
			if loraTag(w) == tag && uint32(w) > 0 {
				if f[i].CompareAndSwap(w, w+1) {
					return uint32(i + 1)
				}
				continue // counted or ended meanwhile: look again
			}
			break
		}
	}
	for i := range f {
		for {
			w := f[i].Load()
			if uint32(w) != 0 {
				break
			}
			if f[i].CompareAndSwap(w, tag|1) {
				return uint32(i + 1)
			}
		}
	}
	return 0
}

// done uncounts a call counted in entry i (add's result, less one).
func (f *loraFlight) done(i int) { f[i].Add(^uint64(0)) }

// slotAware reports whether picks for svc heed LoRA slots: its scorer is
// a scoring.LLM that prices the wait. An unknown svc is not.
func (b *Balancer) slotAware(svc inferlb.Service) bool {
	return int(svc) < len(b.cfg.slotWaits) && b.cfg.slotWaits[svc]
}

// slotsLive reports whether the Store merged adapters recently enough for
// any member to hold a fresh reading of them.
func (b *Balancer) slotsLive(nowNs int64) bool {
	at := b.cfg.store.AdaptersObserved()
	if at == 0 {
		return false
	}
	return b.cfg.telemetryMaxAge <= 0 || nowNs-at <= int64(b.cfg.telemetryMaxAge)
}

// slotFull reports whether e's slots are all taken by adapters other than
// model (h is its modelID): its fresh reading's running adapters and those
// this process has calls of in flight there, counted once each. An
// adapter that runs there, or has calls of this process in flight there,
// is never full; one that only waits there is, when the slots are (see
// telemetry.Sample.SlotWait). The base model and a member with no fresh
// reading are never full.
func (e *endpoint) slotFull(model string, h uint64, nowNs int64, maxAge time.Duration) bool {
	a, slots, ok := e.slot.Load().LoRA(time.Unix(0, nowNs), maxAge)
	if !ok || model == a.Base || slices.Contains(a.Running, model) {
		return false
	}
	used := len(a.Running)
	var seen [loraFlights]uint64
	n := 0
	for i := range e.lora {
		w := e.lora[i].Load()
		if uint32(w) == 0 {
			continue
		}
		tag := loraTag(w)
		switch {
		case tag == loraTag(h):
			return false // this process's calls of it run (or wait) there
		case slices.Contains(seen[:n], tag) || runs(a.Running, tag):
		default:
			seen[n] = tag
			n++
			used++
		}
	}
	return float64(used) >= slots
}

// runs reports whether an adapter whose loraTag is tag is among running.
func runs(running []string, tag uint64) bool {
	for _, n := range running {
		if loraTag(modelID(n)) == tag {
			return true
		}
	}
	return false
}

// drawSlot is draw for a call with c.slots set, with a candidate whose
// slots are full for req's adapter drawn again up to slotRedraws times.
// full says the candidate returned is full still.
func (b *Balancer) drawSlot(req *inferlb.Request, g *group, c cand, sh *shard, not int) (i int, full bool) {
	i = b.draw(g, c, sh, not)
	if i < 0 {
		return i, false
	}
	h := modelID(req.Model)
	for k := 0; ; k++ {
		if full = g.members[i].slotFull(req.Model, h, c.nowNs, b.cfg.telemetryMaxAge); !full || k == slotRedraws {
			return i, full
		}
		if j := b.draw(g, c, sh, not); j >= 0 {
			i = j
		}
	}
}

// countLoRA counts a call for req's adapter (c.slots set) in flight on
// e, when e's reading has LoRA slots and req names an adapter, and
// returns the Pick.flags bits that name its entry.
func (b *Balancer) countLoRA(req *inferlb.Request, e *endpoint, c cand) uint32 {
	a, _, ok := e.slot.Load().LoRA(time.Unix(0, c.nowNs), b.cfg.telemetryMaxAge)
	if !ok || req.Model == a.Base {
		return 0
	}
	return e.lora.add(modelID(req.Model)) << pickLoRAShift
}

// uncountLoRA ends what countLoRA counted for p.
func uncountLoRA(p *Pick) {
	if i := (atomic.LoadUint32(&p.flags) & pickLoRAMask) >> pickLoRAShift; i != 0 {
		p.e.lora.done(int(i) - 1)
	}
}
