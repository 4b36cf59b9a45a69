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
// The memory is bounded whatever the requests say: a table of lackPairs
// (endpoint, model) pairs and one of lackModels models (a pick consults
// the pairs only for a model the second holds), 34 KiB allocated at the
// first such answer, each 4-way set associative with two choices: an
// entry may live in either of two sets, chosen by two parts of its hash,
// and a new one goes to the one with more free or lapsed slots; when both
// are full of live entries, the one of their 8 that lapses first is
// replaced. A fleet of 8 replicas and 32 adapters, each on 2 of them, needs
// 192 pairs; 4 slots per endpoint, the first layout, thrashed (the fleet
// simulator's lora-many scenario: 5,399 not-served answers in 11,900 calls
// and 157 failed, against 1,472 and none with this table). With one set
// per entry it fitted in about 99 processes of 100: with 13 of 1,000
// seeds, 5 of the 32 models or 5 of the 192 pairs shared a set of 4, so
// one adapter's memory kept evicting itself and its calls met a replica
// without it again, an extra hop each; with two it fits with all 1,000
// (TestNotServedMemoryHoldsAManyAdapterFleet runs those 13). Model names are
// request data: they are stored as tags of a hash seeded per process (the
// affinity Keyer's seed), so a client cannot aim a name of its own at
// another model's entry.
//
// Nor can it evict the entries of a model the fleet serves by sending
// made-up names: each such call goes round the fleet (the HTTP adapter's
// hops), and every endpoint's answer takes a pair. Entries lapse in the
// order they were written, and a real adapter's, learnt once and then
// only read, lapse first, so a flood of made-up names (100 a second over
// 16 replicas) evicted them and sent 52 of 1,000 calls for an adapter on
// 2 of the 16 to a replica without it, an extra hop each
// (TestMadeUpModelsKeepRealAdapterMemory). An entry is now kept once an
// endpoint served its model to a call the memory steered (Outcome.Model
// on a success; keepModel), and so are the model's pairs, the ones
// written before and after; full sets give up an entry not kept, the
// one that lapses first, before a kept one. No endpoint serves a made-up
// name, so its entries are never kept and make room for each other: the
// same flood misroutes none. A kept entry still lapses after
// NotServedMemory, as any does. It costs a pick nothing while nothing is
// remembered, and a call the memory steered one hash when it is served,
// once per model while its entry lives.
// A model every endpoint that could take a call is remembered not to serve
// is picked as if nothing were remembered: the memory may be stale (the
// adapter loaded since), and the call's answer is the server's to give.
//
// The cost to a pick while nothing is remembered is one atomic load (the
// latest expiry of any entry, lackAt) and a comparison.

const (
	lackPairs  = 4096 // (endpoint, model) pairs remembered
	lackModels = 256  // models remembered
	lackWays   = 4    // entries per set

	// One 64-bit word holds an entry: a 24-bit tag of what it is about
	// and the time it lapses, in units of 2^24 ns (about 16.8 ms) offset
	// by 2^39 so that every int64 time, the zero time's too, maps in order
	// onto 40 bits, which never wrap.
	lackUnitShift = 24
	lackTimeBits  = 40
	lackTimeMask  = 1<<lackTimeBits - 1

	// The top bit of an entry marks it kept: the entry of a model that
	// an endpoint served while it was remembered, or of a pair of such a
	// model (see keepModel). The tag is the 23 bits below it.
	lackKept    = 1 << 63
	lackTagMask = 1<<23 - 1

	// lackAltShift is where the bits choosing an entry's second set
	// start in its key: above those of the first (at most 10, for the
	// pairs' 1,024 sets) and below those of the tag (from lackTimeBits).
	lackAltShift = 20
)

// lackTable is the memory: the pairs, then the models.
type lackTable struct {
	pairs  [lackPairs]atomic.Uint64
	models [lackModels]atomic.Uint64
	// horizon is how far ahead of now, in units, an entry written at now
	// may lapse (lackHorizon); one lapsing further ahead was written
	// before the clock stepped back, and counts as lapsed (lackLapsed).
	horizon uint64
}

// lackHorizon is how far ahead of the time it is written, in units, an
// entry may lapse: the longest pass-over (NotServedMemory, or a model's
// failures' MaxEjectionTime, bounded by maxHold), rounded up, plus
// stepTolerance, for goroutines' readings of the clock that race.
func (c *config) lackHorizon() uint64 {
	d := min(max(c.notServedTTL, c.maxEjectionTime), maxHold) + stepTolerance
	return uint64(d>>lackUnitShift) + 2
}

// lackLapsed reports whether entry w has lapsed at now: its time is past,
// or further ahead than horizon, so it was written before the clock
// stepped back. Left live, it held for the length of the step on top of
// its own (an endpoint that loaded the adapter since passed over for an
// hour after an hour's NTP step, a made-up name's entry taking a slot as
// long); like the core's deadlines set before a step (afterStepBack), it
// ends at the step.
func lackLapsed(w, now, horizon uint64) bool {
	t := w & lackTimeMask
	return t <= now || t-now > horizon
}

// lackNow is the unit count of nowNs.
func lackNow(nowNs int64) uint64 { return uint64(nowNs>>lackUnitShift + 1<<(lackTimeBits-1)) }

// lackSets are the two sets of a table an entry may live in (two-choice
// hashing): the second is nil when both choices are the same set.
type lackSets [2][]atomic.Uint64

// lackSet returns the sets of table for key, and key's tag (never 0). The
// sets are chosen by two parts of key that do not overlap each other or
// the tag: bits from 0 and from lackAltShift.
func lackSet(table []atomic.Uint64, key uint64) (lackSets, uint64) {
	n := uint64(len(table) / lackWays)
	i, j := int(key%n)*lackWays, int(key>>lackAltShift%n)*lackWays
	s := lackSets{table[i : i+lackWays]}
	if j != i {
		s[1] = table[j : j+lackWays]
	}
	return s, max(key>>lackTimeBits&lackTagMask, 1)
}

// lackTag is the tag of entry w.
func lackTag(w uint64) uint64 { return w >> lackTimeBits & lackTagMask }

// lackLive reports whether sets hold tag, live at now (see lackLapsed).
func lackLive(sets lackSets, tag, now, horizon uint64) bool {
	_, ok := lackFind(sets, tag, now, horizon)
	return ok
}

// lackFind returns the entry of tag in sets, live at now (see
// lackLapsed), if they hold one.
func lackFind(sets lackSets, tag, now, horizon uint64) (uint64, bool) {
	for _, set := range sets {
		for i := range set {
			if w := set[i].Load(); lackTag(w) == tag && !lackLapsed(w, now, horizon) {
				return w, true
			}
		}
	}
	return 0, false
}

// modelKey is model's seeded 64-bit hash.
func (b *Balancer) modelKey(model string) uint64 {
	var d xxhash.Digest
	d.ResetWithSeed(b.keyer.Seed())
	_, _ = d.WriteString("model\x00")
	_, _ = d.WriteString(model)
	return d.Sum64()
}

// pairKey is the key of (endpoint serial, model key) in the pairs table.
func pairKey(serial, model uint64) uint64 {
	return mix64(model ^ serial*0x9e3779b97f4a7c15)
}

// mix64 is a 64-bit finalizer (splitmix64's), spreading serials and model
// keys over the pairs' sets and tags.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// lackPut records tag, lapsing at until, in one of sets: its live entry
// is extended (kept, if asked, and kept if it was), or else a free or
// lapsed slot takes it, in the set with more of them (the first on a tie),
// or else, across both sets, the live entry that lapses first among those
// not kept, or, when all are kept, among all: entries of models nobody
// served (made-up names) make room for each other before they evict those
// of a model that is served somewhere. It reports whether tag was not live
// there before. Two writers of one tag race to the same slot and one
// retries; only a third writer changing the sets between their scans can
// leave the tag in two slots (both live, both lapsing: harmless, and an
// EventNotServed twice).
func lackPut(sets lackSets, tag, until, now, horizon uint64, kept bool) bool {
	free := func(w uint64) bool { return lackLapsed(w, now, horizon) }
	// rank orders the candidates to replace: lapsed, then live and not
	// kept, then kept; within a rank, the one that lapses first.
	rank := func(w uint64) uint64 {
		switch {
		case free(w):
			return 0
		case w&lackKept == 0:
			return 1<<lackTimeBits | w&lackTimeMask
		}
		return 2<<lackTimeBits | w&lackTimeMask
	}
	var want uint64
	if kept {
		want = lackKept
	}
	for {
		// keep and the expiry are taken afresh from what each pass
		// reads: an entry cleared since the last (forget, when the
		// endpoint served the model) must not come back kept or longer.
		var seen [2][lackWays]uint64
		var nfree [2]int
		vs, vi, found := -1, -1, false
		var old uint64
		for k, set := range sets {
			for i := range set {
				w := set[i].Load()
				seen[k][i] = w
				switch {
				case free(w):
					nfree[k]++
				case !found && lackTag(w) == tag:
					vs, vi, old, found = k, i, w, true
				}
			}
		}
		keep, to := want, until
		if found {
			if old&lackTimeMask >= until && (old&lackKept != 0 || !kept) {
				return false // lapses no sooner already
			}
			keep |= old & lackKept
			to = max(to, old&lackTimeMask)
		} else {
			first := 0
			if nfree[1] > nfree[0] {
				first = 1
			}
			for _, k := range [2]int{first, 1 - first} {
				for i := range sets[k] {
					if w := seen[k][i]; vs < 0 || rank(w) < rank(old) {
						vs, vi, old = k, i, w
					}
				}
			}
		}
		if sets[vs][vi].CompareAndSwap(old, keep|tag<<lackTimeBits|to&lackTimeMask) {
			return !found
		}
	}
}

// lacks reports whether e is remembered not to serve the model of key
// model at now.
func (t *lackTable) lacks(e *endpoint, model, now uint64) bool {
	sets, tag := lackSet(t.pairs[:], pairKey(e.serial, model))
	return lackLive(sets, tag, now, t.horizon)
}

// notServed records e's answer that it does not serve model, at nowNs.
func (b *Balancer) notServed(e *endpoint, model string, nowNs int64) {
	ttl := b.cfg.notServedTTL
	if ttl <= 0 || model == "" {
		return
	}
	if b.passOverFor(e, b.modelKey(model), nowNs, ttl) {
		b.emit(e, Event{Kind: EventNotServed, Endpoint: e.id, Model: model, At: time.Unix(0, nowNs), Until: time.Unix(0, nowNs+int64(ttl))})
	}
}

// passOverFor records that the picks of the model of key model pass e
// over for d from nowNs (the entry is extended, never shortened). It
// reports whether e was not passed over for it before.
func (b *Balancer) passOverFor(e *endpoint, model uint64, nowNs int64, d time.Duration) bool {
	t := b.lack.Load()
	if t == nil {
		b.lack.CompareAndSwap(nil, &lackTable{horizon: b.cfg.lackHorizon()})
		t = b.lack.Load()
	}
	// Saturating, as exclusions are: a pass-over of a model failing
	// there lasts up to MaxEjectionTime, which may be meant as "for
	// ever" (the largest Duration), and nowNs + d wrapped to a time past,
	// so the entry had lapsed before it was written.
	d = min(d, maxHold)
	now := lackNow(nowNs)
	until := min(lackNow(later(nowNs, d))+1, lackTimeMask) // rounded up: never shorter than d
	set, tag := lackSet(t.models[:], model)
	lackPut(set, tag, until, now, t.horizon, false)
	w, _ := lackFind(set, tag, now, t.horizon)
	set, tag = lackSet(t.pairs[:], pairKey(e.serial, model))
	fresh := lackPut(set, tag, until, now, t.horizon, w&lackKept != 0)
	for untilNs := later(nowNs, d+1<<lackUnitShift); ; {
		cur := b.lackAt.Load()
		if cur >= untilNs || b.lackAt.CompareAndSwap(cur, untilNs) {
			break
		}
	}
	return fresh
}

// forget ends e's entry for the model of key model, if it has one.
func (t *lackTable) forget(e *endpoint, model uint64) {
	sets, tag := lackSet(t.pairs[:], pairKey(e.serial, model))
	for _, set := range sets {
		for i := range set {
			if w := set[i].Load(); lackTag(w) == tag {
				set[i].CompareAndSwap(w, 0)
			}
		}
	}
}

// keepModel marks kept the entry of model, which e served to a call
// whose pick the memory steered (pickKeep), and the entries of model's
// pairs with the members of e's groups, so that made-up names, which no
// endpoint serves, evict each other's entries before these (lackPut). It
// runs once per model while its entry lives: later pairs of a kept model
// are kept as they are written (passOverFor).
func (b *Balancer) keepModel(e *endpoint, model string, nowNs int64) {
	t := b.lack.Load()
	if t == nil {
		return
	}
	key, now := b.modelKey(model), lackNow(nowNs)
	set, tag := lackSet(t.models[:], key)
	if !keepEntry(set, tag, now, t.horizon) {
		return
	}
	if pools := e.pools.Load(); pools != nil {
		for _, g := range *pools {
			for _, m := range g.members {
				set, tag := lackSet(t.pairs[:], pairKey(m.serial, key))
				keepEntry(set, tag, now, t.horizon)
			}
		}
	}
}

// keepEntry marks the live entry of tag in sets kept, if they have one;
// it reports whether they have one.
func keepEntry(sets lackSets, tag, now, horizon uint64) bool {
	for _, set := range sets {
		for i := range set {
			for {
				w := set[i].Load()
				if lackTag(w) != tag || lackLapsed(w, now, horizon) {
					break
				}
				if w&lackKept != 0 || set[i].CompareAndSwap(w, w|lackKept) {
					return true
				}
			}
		}
	}
	return false
}

// lacking sets c up to pass over the members of g remembered not to serve
// model (c.lack, c.model) when there are some, and another that c allows is
// not. It leaves c as it was when the memory has nothing to say about the
// model, or when it would leave the call nowhere to go; then all reports
// whether every endpoint c allows is remembered not to serve it (a retry
// then has nowhere to go: see pickWith). Only picks made while some entry
// is live (lackAt) call it.
func (b *Balancer) lacking(model string, g *group, c *cand) (all bool) {
	t := b.lack.Load()
	if t == nil {
		return false
	}
	key, now := b.modelKey(model), lackNow(c.nowNs)
	set, tag := lackSet(t.models[:], key)
	w, ok := lackFind(set, tag, now, t.horizon)
	if !ok {
		return false
	}
	some, other := false, false
	for _, e := range g.members {
		if !c.ok(e) {
			continue
		}
		if t.lacks(e, key, now) {
			some = true
		} else {
			other = true
		}
		if some && other {
			c.lack, c.model, c.keep = t, key, w&lackKept == 0
			return false
		}
	}
	return some
}

// passedOver is passOver, and narrows r to the needs (windowNeed and
// promptNeed) for which e is passed over, or not, as for c's (see
// fitCache).
func (c *cand) passedOver(e *endpoint, r *needRange) bool {
	now := lackNow(c.nowNs)
	if c.lack != nil && c.lack.lacks(e, c.model, now) || c.refused != nil && c.refused.marked(e, c.tenant, now) {
		return true // whatever the call's tokens
	}
	if c.model == 0 {
		return false // no model key: no window read (tooSmall)
	}
	w, wp := e.windowOf(c.model, c.nowNs), e.windowOf(c.model^promptSalt, c.nowNs)
	switch {
	case exceeds(w, int64(c.windowNeed)):
		r.lo = max(r.lo, w)
		return true
	case exceeds(wp, int64(c.promptNeed)):
		r.plo = max(r.plo, wp)
		return true
	}
	if w > 0 {
		r.hi = min(r.hi, w)
	}
	if wp > 0 {
		r.phi = min(r.phi, wp)
	}
	return false
}

// passOver reports whether c passes e over as remembered not to serve the
// call's model, as remembered too small for it (window.go), or as
// refusing its tenant's calls (tenantrefusal.go).
func (c *cand) passOver(e *endpoint) bool {
	return c.lack != nil && c.lack.lacks(e, c.model, lackNow(c.nowNs)) || c.tooSmall(e) ||
		c.refused != nil && c.refused.marked(e, c.tenant, lackNow(c.nowNs))
}
