package balancer

import (
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Models an endpoint said it does not serve.
//
// A fleet whose replicas do not all serve the same models, such as vLLM
// replicas that each load some LoRA adapters (--lora-modules, or at run time
// with VLLM_ALLOW_RUNTIME_LORA_UPDATING), Ollama hosts that pulled different
// models, or Triton servers in explicit model control, answers a call for a
// model a replica lacks at once: vLLM with 404 "The model `x` does not
// exist.", Ollama with 404 "model \"x\" not found", Triton with "Request for
// unknown model". Counted as a success, that answer made the replica look
// like the fastest and least loaded of the fleet, so it drew that model's
// calls and failed them all; counted as a failure, it would trip the
// breaker of a replica that serves its own models well. It is neither: the
// adapters report it as Outcome.NotServedModel, and the endpoint is kept out
// of that model's picks for Options.NotServedMemory, while every other
// model's picks go on as before. Endpoint labels (SubsetLabel) remain the
// way to declare which replica serves what; this memory is for fleets that
// do not declare it, or whose adapters come and go.
//
// The memory is bounded whatever the requests say: lackSlots models per
// endpoint and lackModelSlots models in the Balancer (a pick consults the
// endpoints' memory only for a model the Balancer's list holds), each
// entry replaced when it lapses or, when all are live, the one that lapses
// first. Model names are request data: they are stored as 24-bit hashes
// seeded per process (the affinity Keyer's seed), so a client cannot aim a
// name of its own at another model's entry. A model every endpoint that
// could take a call is remembered not to serve is picked as if nothing
// were remembered: the memory may be stale (the adapter loaded since), and
// the call's answer is the server's to give.
//
// The cost to a pick while nothing is remembered is one atomic load (the
// latest expiry of any entry, lackAt) and a comparison.

const (
	lackSlots      = 4  // models remembered per endpoint
	lackModelSlots = 16 // models remembered in the Balancer

	// One 64-bit word holds an entry: a model's 24-bit hash and the time
	// it lapses, in units of 2^24 ns (about 16.8 ms) offset by 2^39 so that
	// every int64 time, the zero time's too, maps in order onto 40 bits,
	// which never wrap.
	lackUnitShift = 24
	lackTimeBits  = 40
	lackTimeMask  = 1<<lackTimeBits - 1
)

// lackNow is the unit count of nowNs.
func lackNow(nowNs int64) uint64 { return uint64(nowNs>>lackUnitShift + 1<<(lackTimeBits-1)) }

// lackWord packs a model hash and the unit its entry lapses at.
func lackWord(h uint32, until uint64) uint64 { return uint64(h)<<lackTimeBits | until&lackTimeMask }

// lackLive reports whether entry w is for model hash h and live at now.
func lackLive(w uint64, h uint32, now uint64) bool {
	return uint32(w>>lackTimeBits) == h && w&lackTimeMask > now
}

// modelHash is model's seeded 24-bit hash, never 0 (an empty slot).
func (b *Balancer) modelHash(model string) uint32 {
	var d xxhash.Digest
	d.ResetWithSeed(b.keyer.Seed())
	_, _ = d.WriteString("model\x00")
	_, _ = d.WriteString(model)
	if h := uint32(d.Sum64() >> (64 - 24)); h != 0 {
		return h
	}
	return 1
}

// lackPut records that h is not served until the unit until, in slots
// (an endpoint's or the Balancer's list): the entry for h is extended, or
// else a free or lapsed slot, or the one that lapses first, takes it. It
// reports whether h was not remembered there before.
func lackPut(slots []atomic.Uint64, h uint32, until, now uint64) bool {
	free := func(w uint64) bool { return w&lackTimeMask <= now }
	for {
		victim, fresh := -1, true
		var old uint64
		for i := range slots {
			w := slots[i].Load()
			if uint32(w>>lackTimeBits) == h {
				fresh = free(w)
				if !fresh && w&lackTimeMask >= until {
					return false // lapses no sooner already
				}
				victim, old = i, w
				break
			}
			if victim < 0 || !free(old) && (free(w) || w&lackTimeMask < old&lackTimeMask) {
				victim, old = i, w
			}
		}
		if slots[victim].CompareAndSwap(old, lackWord(h, until)) {
			return fresh
		}
	}
}

// lacks reports whether e is remembered not to serve the model of hash h.
func (e *endpoint) lacks(h uint32, now uint64) bool {
	for i := range e.lack {
		if lackLive(e.lack[i].Load(), h, now) {
			return true
		}
	}
	return false
}

// notServed records e's answer that it does not serve model, at nowNs.
func (b *Balancer) notServed(e *endpoint, model string, nowNs int64) {
	ttl := b.cfg.notServedTTL
	if ttl <= 0 || model == "" {
		return
	}
	h, now := b.modelHash(model), lackNow(nowNs)
	until := lackNow(nowNs+int64(ttl)) + 1 // rounded up: never shorter than ttl
	lackPut(b.lackModels[:], h, until, now)
	fresh := lackPut(e.lack[:], h, until, now)
	for untilNs := nowNs + int64(ttl) + 1<<lackUnitShift; ; {
		cur := b.lackAt.Load()
		if cur >= untilNs || b.lackAt.CompareAndSwap(cur, untilNs) {
			break
		}
	}
	if fresh {
		b.emit(Event{Kind: EventNotServed, Endpoint: e.id, Model: model, At: time.Unix(0, nowNs), Until: time.Unix(0, nowNs+int64(ttl))})
	}
}

// lacking returns the hash of req's model when some endpoint of g is
// remembered not to serve it and another that c allows is not: picks then
// pass over the former (cand.ok). It returns 0 when the memory has nothing
// to say about the model, or when it would leave the call nowhere to go;
// then all reports whether every endpoint c allows is remembered not to
// serve it (a retry then has nowhere to go: see pickWith). Only picks made
// while some entry is live (lackAt) call it.
func (b *Balancer) lacking(model string, g *group, c *cand) (h uint32, all bool) {
	h, now := b.modelHash(model), lackNow(c.nowNs)
	listed := false
	for i := range b.lackModels {
		if lackLive(b.lackModels[i].Load(), h, now) {
			listed = true
			break
		}
	}
	if !listed {
		return 0, false
	}
	some, other := false, false
	for _, e := range g.members {
		if !c.ok(e) {
			continue
		}
		if e.lacks(h, now) {
			some = true
		} else {
			other = true
		}
		if some && other {
			return h, false
		}
	}
	return 0, some
}
