package balancer

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/telemetry"
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
//   - drawn again as a P2C candidate, up to slotRedraws times (drawFit),
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

// Pick.flags: the loraFlight entry the call counts in, plus one (0: none);
// its adapterCounts entry, plus one. pickCounted holds them both.
const (
	pickLoRAShift    = 2
	pickLoRAMask     = 0xf << pickLoRAShift
	pickAdapterShift = 6
	pickAdapterMask  = 0x7f << pickAdapterShift
	pickCounted      = pickLoRAMask | pickAdapterMask
)

// DefaultAdapterHomes is Options.AdapterHomes' default: an adapter with at
// most one endpoint's fair share of the calls in flight on its model's
// endpoints goes to its home.
// In the fleet simulator's lora-slots scenario it ends the waits for a
// slot and the cold adapters' long tails (benchmarks/results/lora-slots.md).
const DefaultAdapterHomes = 1.0

// adapterFlights is the size of a Balancer's table of calls in flight
// per adapter (adapterCounts). It fits the 7 bits of Pick.flags that name
// the entry.
const adapterFlights = 64

// adapterCounts counts this Balancer's calls in flight per LoRA adapter
// (of the picks that heed LoRA slots, cand.slots), lock-free: they size
// an adapter's share of the calls on its group for adapterHome. An
// adapter counts in one of two entries that a hash of
// its adapterID names (a word each: its loraTag and a count, as in
// loraFlight), so a
// pick reads two words, not the table; an adapter whose two entries
// both hold others' calls is not counted (it reads as rare). Two picks
// of a new adapter at once may each take one of its entries: count adds
// both.
type adapterCounts struct {
	flight [adapterFlights]atomic.Uint64
	// seed places adapters in the table (entries) and seeds their tags
	// here and in every member's loraFlight (adapterID), so that request
	// data cannot pick names that take a given adapter's entries or tag.
	seed uint64
}

// entries returns the two entries adapter h may count in.
func (a *adapterCounts) entries(h uint64) (i, j int) {
	x := mix64(h ^ a.seed)
	return int(x % adapterFlights), int((x >> 32) % adapterFlights)
}

// add counts a call of adapter h and returns its entry plus one, or 0.
func (a *adapterCounts) add(h uint64) uint32 {
	tag := loraTag(h)
	i, j := a.entries(h)
	for range 2 { // an entry counted or ended under us: look again, once
		for _, k := range [2]int{i, j} {
			if w := a.flight[k].Load(); loraTag(w) == tag && uint32(w) > 0 && a.flight[k].CompareAndSwap(w, w+1) {
				return uint32(k + 1)
			}
		}
		for _, k := range [2]int{i, j} {
			if w := a.flight[k].Load(); uint32(w) == 0 && a.flight[k].CompareAndSwap(w, tag|1) {
				return uint32(k + 1)
			}
		}
	}
	return 0
}

// count returns the calls of adapter h counted in flight.
func (a *adapterCounts) count(h uint64) int64 {
	tag := loraTag(h)
	i, j := a.entries(h)
	var n int64
	if w := a.flight[i].Load(); loraTag(w) == tag {
		n += int64(uint32(w))
	}
	if w := a.flight[j].Load(); j != i && loraTag(w) == tag {
		n += int64(uint32(w))
	}
	return n
}

// Adapter homes.
//
// A call for an adapter goes by its prompt's affinity key, as any call
// does, so an adapter's sessions land all over the group and the adapter
// takes a slot on every endpoint they reach: with more adapters than the
// group has slots (a fleet of per-customer fine-tunes), each endpoint
// cycles through many of them, and the rarely asked ones wait behind the
// popular ones everywhere. adapterHome gives the call of an adapter that
// has few of this process's calls in flight on the endpoints that serve
// it (at most AdapterHomes times one endpoint's fair share of them: the
// calls in flight on the call's group, whatever their model, over the
// group's size, as the load bound shares them) the adapter's own key instead, so that such an
// adapter runs on its home endpoint, and on the ring's next ones when the
// load bound spills it; a popular adapter, whose calls one endpoint could
// not take, spreads by prompt. Independent callers with one AffinitySeed
// agree on the homes, and on which adapters are rare to within their
// share of the traffic. An explicit session (Request.Session) keeps its
// own key.
//
// The share is the group's: a Balancer holding several groups (two base
// models' pools, adapters listed on a few endpoints each, memberships
// over other endpoints) weighed an adapter's calls against every
// slot-aware call it had in flight, so another pool's traffic made a
// pool's busiest adapter look rare, and all its calls went to its home
// instead of spreading by prompt. The adapter's own calls are counted
// across the Balancer: within a membership a model has one group.

// adapterHome returns the affinity key of req's adapter when the call
// should go to the adapter's home (see above), else 0. req's pick heeds
// LoRA slots (cand.slots).
func (b *Balancer) adapterHome(req *inferlb.Request, g *group, nowNs int64) uint64 {
	if !g.adapterCall(req.Model, nowNs, b.cfg.telemetryMaxAge) {
		return 0
	}
	n := b.adapters.count(adapterID(req.Model, b.adapters.seed))
	if float64(n)*float64(len(g.members)) > b.cfg.adapterHomes*float64(g.inFlight()) {
		return 0 // a popular adapter: its calls spread by prompt
	}
	var d xxhash.Digest
	d.ResetWithSeed(b.keyer.Seed())
	_, _ = d.WriteString("adapter\x00")
	_, _ = d.WriteString(req.Model)
	return max(d.Sum64(), 1)
}

// adapterCall reports whether model is a LoRA adapter to g's members:
// not the base model of the first member with a fresh reading of its
// adapters (a homed pick checks the member it chose too: baseAt).
func (g *group) adapterCall(model string, nowNs int64, maxAge time.Duration) bool {
	now := time.Unix(0, nowNs)
	for _, e := range g.members {
		if a, _, ok := e.slot.Load().LoRA(now, maxAge); ok {
			return !a.IsBase(model)
		}
	}
	return false
}

// baseAt reports whether e does not read model as an adapter: model is
// the base model of e's fresh reading, or e reports telemetry but never
// reported its adapters (a server without LoRA).
// adapterCall judges a call by one member's reading; in a
// group of endpoints of several base models (no subset labels), another
// base model's calls were taken for a rarely asked adapter's, and, never
// counted as an adapter's calls (countLoRA reads the endpoint's own
// reading), they never grew popular: every call of that base model went
// to one home whatever its prompt. So did the calls of a model whose
// servers report no adapters (LoRA not enabled there) beside servers
// that do. A homed pick whose endpoint does not read the call as an
// adapter's is made again with the call's own key. An endpoint whose
// reading went stale or was dropped (a reconnect, its failures: Expire)
// keeps its homes: it serves adapters, and which it holds is only not
// known for now; so does one that has reported nothing yet.
func (b *Balancer) baseAt(e *endpoint, model string, nowNs int64) bool {
	sl := e.slot.Load()
	a, _, ok := sl.LoRA(time.Unix(0, nowNs), b.cfg.telemetryMaxAge)
	if !ok {
		h := sl.Held()
		return h != 0 && !h.Has(telemetry.LoRASlots)
	}
	return a.IsBase(model)
}

// loraFlight counts this process's calls in flight on one member per
// LoRA adapter, without locks: each entry is one word, the adapter's
// tag (the high 32 bits of its adapterID) and its count of calls. Two
// picks of a new adapter at once may each take an entry for it; readers
// count an adapter once however many entries hold it.
type loraFlight [loraFlights]atomic.Uint64

func loraTag(h uint64) uint64 { return h >> 32 << 32 }

// adapterID is the hash an adapter is counted by in the LoRA tables
// (loraFlight, adapterCounts): its modelID under the Balancer's seed
// (adapterCounts.seed), a bijection of it. The tables hold 32 bits of it
// (loraTag), so of modelID alone, an unseeded hash, a name sharing a
// given adapter's tag takes about 2^32 hashes to find offline; under the
// seed it takes a 64-bit collision of modelID.
func adapterID(model string, seed uint64) uint64 { return mix64(modelID(model) ^ seed) }

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
// model (h is its adapterID under seed): its fresh reading's running adapters and those
// this process has calls of in flight there, counted once each. An
// adapter that runs there, or has calls of this process in flight there,
// is never full; one that only waits there is, when the slots are (see
// telemetry.Sample.SlotWait). The base model and a member with no fresh
// reading are never full.
func (e *endpoint) slotFull(model string, h, seed uint64, nowNs int64, maxAge time.Duration) bool {
	a, slots, ok := e.slot.Load().LoRA(time.Unix(0, nowNs), maxAge)
	if !ok || a.IsBase(model) || slices.Contains(a.Running, model) {
		return false
	}
	// This process's adapters in flight there, each once, less those the
	// reading has running (counted among them already). Each running name
	// is hashed once: matched against every entry in turn, a pick with
	// 64 names running and 8 other adapters in flight hashed 512 names
	// per candidate (8 us a pick).
	var seen [loraFlights]uint64
	n := 0
	for i := range e.lora {
		w := e.lora[i].Load()
		if uint32(w) == 0 {
			continue
		}
		tag := loraTag(w)
		if tag == loraTag(h) {
			return false // this process's calls of it run (or wait) there
		}
		if !slices.Contains(seen[:n], tag) {
			seen[n] = tag
			n++
		}
	}
	for _, name := range a.Running {
		if n == 0 {
			break
		}
		if k := slices.Index(seen[:n], loraTag(adapterID(name, seed))); k >= 0 {
			n--
			seen[k] = seen[n]
		}
	}
	return float64(len(a.Running)+n) >= slots
}

// countLoRA counts a call whose pick heeds LoRA slots (c.slots set), when
// e's reading has LoRA slots and req names an adapter, as a call of that
// adapter on e and (with adapter homes on) in b.adapters; it returns the
// Pick.flags bits that name what it counted.
func (b *Balancer) countLoRA(req *inferlb.Request, e *endpoint, c cand) uint32 {
	// Only homes read b.adapters, and only keyed picks have homes.
	homes := b.cfg.adapterHomes > 0 && b.cfg.affinity != AffinityOff
	a, _, ok := e.slot.Load().LoRA(time.Unix(0, c.nowNs), b.cfg.telemetryMaxAge)
	if !ok || a.IsBase(req.Model) {
		return 0
	}
	h := adapterID(req.Model, b.adapters.seed)
	f := e.lora.add(h) << pickLoRAShift
	if homes {
		f |= b.adapters.add(h) << pickAdapterShift
	}
	return f
}

// uncountLoRA ends what countLoRA counted for p.
func uncountLoRA(p *Pick) {
	f := atomic.LoadUint32(&p.flags)
	if i := (f & pickLoRAMask) >> pickLoRAShift; i != 0 {
		p.e.lora.done(int(i) - 1)
	}
	if i := (f & pickAdapterMask) >> pickAdapterShift; i != 0 {
		p.e.b.adapters.flight[i-1].Add(^uint64(0))
	}
}
