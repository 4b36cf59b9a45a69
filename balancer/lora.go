package balancer

import (
	"slices"
	"sync"
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
// loraFlights adapters), and an adapter with calls in flight takes a slot
// (or, for its own calls, holds one) as the reading's running adapters do.
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
// LoRA adapter (by modelID). Writers take mu; readers load the entries
// without it.
type loraFlight struct {
	mu   sync.Mutex
	hash [loraFlights]atomic.Uint64
	n    [loraFlights]atomic.Int32
}

// add counts a call of adapter h and returns its entry plus one, or 0
// when every entry holds another adapter's calls.
func (f *loraFlight) add(h uint64) uint32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	free := -1
	for i := range f.hash {
		if f.hash[i].Load() == h && f.n[i].Load() > 0 {
			f.n[i].Add(1)
			return uint32(i + 1)
		}
		if free < 0 && f.n[i].Load() == 0 {
			free = i
		}
	}
	if free < 0 {
		return 0
	}
	f.hash[free].Store(h)
	f.n[free].Store(1)
	return uint32(free + 1)
}

// done uncounts a call counted in entry i (add's result, less one).
func (f *loraFlight) done(i int) {
	f.mu.Lock()
	f.n[i].Add(-1)
	f.mu.Unlock()
}

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
	if f := e.lora.Load(); f != nil {
		for i := range f.n {
			if f.n[i].Load() <= 0 {
				continue
			}
			switch fh := f.hash[i].Load(); {
			case fh == h:
				return false // this process's calls of it run (or wait) there
			case !runs(a.Running, fh):
				used++
			}
		}
	}
	return float64(used) >= slots
}

// runs reports whether an adapter whose modelID is h is among running.
func runs(running []string, h uint64) bool {
	for _, n := range running {
		if modelID(n) == h {
			return true
		}
	}
	return false
}

// drawSlot is draw, with a candidate whose slots are full for req's
// adapter drawn again up to slotRedraws times (when c.slots). full says
// the candidate returned is full still.
func (b *Balancer) drawSlot(req *inferlb.Request, g *group, c cand, sh *shard, not int) (i int, full bool) {
	i = b.draw(g, c, sh, not)
	if !c.slots || i < 0 {
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

// countLoRA counts a call for req's adapter in flight on e, when e's
// reading has LoRA slots and req names an adapter, and returns the
// Pick.flags bits that name its entry.
func (b *Balancer) countLoRA(req *inferlb.Request, e *endpoint, c cand) uint32 {
	if !c.slots {
		return 0
	}
	a, _, ok := e.slot.Load().LoRA(time.Unix(0, c.nowNs), b.cfg.telemetryMaxAge)
	if !ok || req.Model == a.Base {
		return 0
	}
	f := e.lora.Load()
	if f == nil {
		// Once per member that takes an adapter's call: 200 bytes.
		e.lora.CompareAndSwap(nil, new(loraFlight))
		f = e.lora.Load()
	}
	return f.add(modelID(req.Model)) << pickLoRAShift
}

// uncountLoRA ends what countLoRA counted for p.
func uncountLoRA(p *Pick) {
	if i := (atomic.LoadUint32(&p.flags) & pickLoRAMask) >> pickLoRAShift; i != 0 {
		p.e.lora.Load().done(int(i) - 1)
	}
}
