package balancer

import (
	"time"

	"github.com/inferlb/inferlb"
)

// Sleeping servers.
//
// A vLLM server put to sleep (--enable-sleep-mode, POST /sleep) has
// offloaded or discarded its weights and serves nothing until it is woken
// (POST /wake_up): recent vLLM holds its calls until then, older releases
// failed them. vLLM lets a server sleep only once its calls are done, so
// its /metrics show an idle scheduler and an empty KV cache, the most
// attractive reading of the fleet. A fresh reading that says it sleeps
// (telemetry.Asleep 1, from vllm:engine_sleep_state) makes an endpoint
// one that cannot serve now, as one whose LoRA slots are full for the
// call's adapter (lora.go):
//
//   - drawn again as a P2C candidate, up to slotRedraws times (drawFit),
//     and of a sleeping candidate and an awake one the awake one wins,
//     whatever their costs: with one member of four asleep no call goes
//     there; when both candidates still sleep (most of the group asleep),
//     the group is searched for awake members (fitScan);
//   - out of bound as an affinity owner (withinBound): its keys spill to
//     the next endpoint in their order, and come back once it wakes
//     (with StickyTTL, once a spilled key's sticky entry lapses, as after
//     any spill); the awake members share the group's load without its
//     weight;
//   - the worst of a full scan's candidates (scan);
//   - with every candidate of a tenant's shard (TenantShardSize) asleep,
//     passed over for an awake endpoint of the group, as a shard that is
//     down is (a strict shard keeps its calls: pickWith);
//   - priced high by scoring.LLM, for when every candidate sleeps.
//
// It is not taken out of rotation: with every endpoint of the group
// asleep a call still goes to one of them, to wait there for its wake-up
// (or fail, on older vLLM), rather than failing at once with no endpoint,
// since a fleet is put to sleep to be woken (between the rollouts of a
// reinforcement-learning loop, for one). The awake reading of the next
// scrape restores the endpoint; a stale reading is neutral, as every stale
// reading is, and a reconnect drops it (telemetry.ProcessLoad: a restarted
// server starts awake). PickAt still sends a call to its endpoint while it
// sleeps: the state the call needs is there. With no endpoint seen asleep
// within TelemetryMaxAge a pick pays one atomic load for all this
// (telemetry.Store.AsleepObserved).

// sleepLive reports whether the Store merged a reading of a sleeping
// server recently enough for any member to hold a fresh one.
func (b *Balancer) sleepLive(nowNs int64) bool {
	at := b.cfg.store.AsleepObserved()
	if at == 0 {
		return false
	}
	return b.cfg.telemetryMaxAge <= 0 || nowNs-at <= int64(b.cfg.telemetryMaxAge)
}

// asleep reports whether e's fresh reading says its server sleeps.
func (e *endpoint) asleep(nowNs int64, maxAge time.Duration) bool {
	return e.slot.Load().Asleep(time.Unix(0, nowNs), maxAge)
}

// unfit reports whether member e cannot serve req now: with c.sleep, its
// server sleeps; with c.slots, its LoRA slots are full for req's adapter
// (h is its adapterID).
func (b *Balancer) unfit(req *inferlb.Request, e *endpoint, h uint64, c cand) bool {
	return c.sleep && e.asleep(c.nowNs, b.cfg.telemetryMaxAge) ||
		c.slots && e.slotFull(req.Model, h, b.adapters.seed, c.nowNs, b.cfg.telemetryMaxAge)
}

// drawFit is draw for a call with c.slots or c.sleep set, with a
// candidate that cannot serve it now (unfit) drawn again up to
// slotRedraws times. unfit says the candidate returned still cannot.
func (b *Balancer) drawFit(req *inferlb.Request, g *group, c cand, sh *shard, not int) (i int, unfit bool) {
	i = b.draw(g, c, sh, not)
	if i < 0 {
		return i, false
	}
	var h uint64
	if c.slots {
		h = adapterID(req.Model, b.adapters.seed)
	}
	for k := 0; ; k++ {
		if unfit = b.unfit(req, g.members[i], h, c); !unfit || k == slotRedraws {
			return i, unfit
		}
		if j := b.draw(g, c, sh, not); j >= 0 {
			i = j
		}
	}
}

// fitScan looks through the group (or the shard sh) from a random start for
// members that can serve req now (not unfit: awake, with an adapter slot
// when that counts) and returns the cheaper of the first two it finds, the
// one if it finds one, or -1. choose calls it when both two-choice
// candidates and their redraws cannot serve and one of them sleeps: with
// most of a group asleep (a reinforcement-learning loop that sleeps all but
// a few replicas between rollouts) the redraws land on sleepers too, and
// 7 of 8 asleep sent 42% of the calls to wait for a wake-up while the
// awake one idled. It costs a pass over the group only then.
func (b *Balancer) fitScan(req *inferlb.Request, g *group, c cand, sh *shard, now time.Time) int {
	n := len(g.members)
	if sh != nil {
		n = sh.n
	}
	var h uint64
	if c.slots {
		h = adapterID(req.Model, b.adapters.seed)
	}
	first := -1
	start := int(b.rand() % uint64(n))
	for k := range n {
		i := (start + k) % n
		if sh != nil {
			i = int(sh.members[i])
		}
		if e := g.members[i]; !c.ok(e) || b.unfit(req, e, h, c) {
			continue
		}
		if first < 0 {
			first = i
			continue
		}
		if b.prefer(req, g, first, i, now, c.steer) {
			return i
		}
		return first
	}
	return first
}
