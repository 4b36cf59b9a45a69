package balancer

import (
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
// vllm:lora_requests_info). For a call that names an adapter, a member
// whose fresh reading has every slot taken by other adapters is
//
//   - out of bound for the call's affinity key (withinBound): the key
//     spills past it as past an owner over its load bound, since the
//     wait outlasts what a warm prefix saves;
//   - drawn again as a P2C candidate, up to slotRedraws times (drawSlot),
//     so both candidates are full only when nearly the whole group is
//     (with half the members full, one pick in sixty-four instead of one
//     in four), and the draw stays bounded when every member is full;
//   - priced by the scorer (scoring.LLM's LoRAWait; LoRALoad for a member
//     that would load the adapter into a free slot).
//
// All of it applies to a service whose scorer is a scoring.LLM that
// prices the wait (LoRAWait not 1). With no LoRA reading anywhere it
// costs a pick with a model one atomic load (Store.AdaptersObserved).

// slotRedraws is how many times a P2C candidate whose slots are full for
// the call's adapter is drawn again.
const slotRedraws = 2

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

// slotFull reports whether e's fresh LoRA reading has every slot taken by
// adapters other than model.
func (e *endpoint) slotFull(model string, nowNs int64, maxAge time.Duration) bool {
	_, full := e.slot.Load().SlotWait(model, time.Unix(0, nowNs), maxAge)
	return full
}

// drawSlot is draw, with a candidate whose slots are full for req's
// adapter drawn again up to slotRedraws times (when c.slots).
func (b *Balancer) drawSlot(req *inferlb.Request, g *group, c cand, sh *shard, not int) int {
	i := b.draw(g, c, sh, not)
	if !c.slots {
		return i
	}
	for range slotRedraws {
		if i < 0 || !g.members[i].slotFull(req.Model, c.nowNs, b.cfg.telemetryMaxAge) {
			break
		}
		if j := b.draw(g, c, sh, not); j >= 0 {
			i = j
		}
	}
	return i
}
