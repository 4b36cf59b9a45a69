package balancer

import (
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/inferlb/inferlb/internal/decay"
)

// Data-parallel attention (Options.DPGroupLabel).
//
// Engines that serve a model with data-parallel attention (DeepSeek-class
// MoE models; with vLLM's external data-parallel mode each rank is its own
// server and endpoint) run every forward step as a collective: a step lasts
// as long as its busiest rank's. A rank that takes a long prefill chunk
// holds every other rank of its engine for that step, whatever they have
// to do. So what a prompt costs depends on where the engine's other ranks
// are: sent to a rank whose engine already has a rank prefilling as much,
// it fills a valley under that step and stalls nobody; sent where nothing
// is prefilling, it makes a new peak the whole engine waits for.
//
// The balancer keeps, per rank, a decaying estimate of the prompt tokens it
// sent there recently (the prefill that rank is likely still doing), and P2C
// multiplies a rank's cost by 1 + over / 8192 tokens, where over is how far
// the rank's estimate plus the new prompt would rise above the highest
// estimate among its engine's ranks (0 when it stays below; an estimate
// under 256 tokens, what ended calls leave, counts as none). In the fleet
// simulator's data-parallel scenario (2 engines x 8 ranks, heavy/light
// mix) this raised throughput at 25 req/s from 7.00k to 7.3k tokens/s and
// cut e2e p99 at 20 req/s from 91 s to 78 s (means of seeds 1-3); the same
// estimate without the engine (each rank against itself; a temporary edit)
// got 7.15k and
// 89 s, so the gain is the barrier's.
const (
	// DefaultDPGroupLabel is the endpoint label naming the data-parallel
	// engine a rank belongs to.
	DefaultDPGroupLabel = "dp_group"
	// prefillWindow is the time constant of the recent-prefill estimate
	// (here and in prefillBacklog): about how long a server takes to work
	// through a few thousand prompt tokens. For the DP barrier 250 ms and
	// 500 ms did equally well in the simulator, 1 s a little worse.
	prefillWindow = 500 * time.Millisecond
	// dpStallTokens is the rise above the engine's peak that doubles a
	// rank's cost: one chunk of vLLM's default max_num_batched_tokens.
	// Weights of 1/8192 and 2/8192 did equally well in the simulator.
	dpStallTokens = 8192
)

// prefillEstimate is a decaying sum of prompt tokens: float32 tokens in the
// high 32 bits, the time of the last update in milliseconds (mod 2^32) in
// the low 32, updated by compare-and-swap so Pick takes no lock. The age
// is read as a signed 32-bit difference, so an estimate not updated for
// more than 24.8 days (2^31 ms) reads as one from the future (a clock
// stepped back) and comes back undecayed, at what was left at its last
// update: usually little, as calls decay it first.
type prefillEstimate struct{ v atomic.Uint64 }

func unpackPrefill(v uint64) (tokens float64, ms uint32) {
	return float64(math.Float32frombits(uint32(v >> 32))), uint32(v)
}

func decayedPrefill(v uint64, nowNs int64) float64 {
	tokens, ms := unpackPrefill(v)
	if tokens == 0 {
		return 0
	}
	// Signed: a reading a little older than the last update (a racing
	// pick read the clock later, or the clock stepped back) is no decay,
	// not an age of 2^32 ms that would wipe the estimate.
	dt := max(int32(uint32(nowNs/int64(time.Millisecond))-ms), 0)
	return tokens * decay.Weight(float64(dt)/float64(prefillWindow/time.Millisecond))
}

// stampAhead reports whether the estimate v was last updated more than
// stepTolerance after nowNs: the clock stepped back since.
func stampAhead(v uint64, nowNs int64) bool {
	_, ms := unpackPrefill(v)
	return int32(ms-uint32(nowNs/int64(time.Millisecond))) > int32(stepTolerance/time.Millisecond)
}

// done takes out what a call of tokens prompt tokens sent at startNs still
// adds to the estimate at nowNs: a call that has ended is past its prefill.
func (p *prefillEstimate) done(nowNs, startNs int64, tokens float64) {
	if left := tokens * decay.Weight(float64(nowNs-startNs)/float64(prefillWindow)); left > 0 {
		p.add(nowNs, -left)
	}
}

// at returns the estimate at nowNs, as decayedPrefill does. After a clock
// stepped back past the last update, it restamps the estimate at nowNs,
// undecayed, so that it decays from there: as of a time ahead, it did not
// decay for the length of the step, and an endpoint sent a long prompt
// just before the step lost every comparison for as long.
func (p *prefillEstimate) at(nowNs int64) float64 {
	v := p.v.Load()
	tokens, ms := unpackPrefill(v)
	if tokens == 0 {
		return 0
	}
	now := uint32(nowNs / int64(time.Millisecond))
	dt := int32(now - ms)
	if dt < -int32(stepTolerance/time.Millisecond) {
		p.v.CompareAndSwap(v, v&^math.MaxUint32|uint64(now))
	}
	return tokens * decay.Weight(float64(max(dt, 0))/float64(prefillWindow/time.Millisecond))
}

// add adds tokens at nowNs (negative tokens take them out; the estimate
// never goes below 0).
func (p *prefillEstimate) add(nowNs int64, tokens float64) {
	for {
		old := p.v.Load()
		ms := uint32(nowNs / int64(time.Millisecond))
		if tok, at := unpackPrefill(old); tok != 0 && int32(at-ms) > 0 && !stampAhead(old, nowNs) {
			// Never move the stamp back for a racing reading: the estimate
			// is as of the later time. After a step back it moves back.
			ms = at
		}
		next := uint64(math.Float32bits(float32(max(decayedPrefill(old, nowNs)+tokens, 0))))<<32 | uint64(ms)
		if p.v.CompareAndSwap(old, next) {
			return
		}
	}
}

// barrier is the factor by which sending a prompt of tokens to e raises
// its engine's step (see above). An endpoint in no engine is an engine of
// its own: its step rises by the whole prompt, as that of a rank that is
// its engine's peak (or whose engine is idle) does. Priced at 1 instead,
// it won every comparison against the ranks of an idle engine whenever
// the two shared a group (a plain replica beside vLLM's per-rank servers
// of the same model): 1 against 1 + tokens/8192, so a 32k-token prompt
// went to it over an idle rank even with three short calls in flight
// there. It is priced only on a Balancer with engines; where no candidate
// is a rank, every one pays the same factor, and the order stands.
func barrier(e *endpoint, tokens int, nowNs int64) float64 {
	if tokens <= 0 {
		return 1
	}
	peers := e.dpPeers.Load()
	if peers == nil {
		return 1 + float64(tokens)/dpStallTokens
	}
	peak := 0.0
	for _, p := range *peers {
		peak = max(peak, recentPrefill(p, nowNs))
	}
	over := recentPrefill(e, nowNs) + float64(tokens) - peak
	if over <= 0 {
		return 1
	}
	return 1 + over/dpStallTokens
}

// recentPrefill is e's prefill estimate at nowNs, 0 below prefillFloor:
// what ended calls leave (float32 rounding of what they took out, the
// nanoseconds their millisecond stamps lose, and up to about 0.6% of each
// prompt, as decaying in steps, (1-x/32)^32 each, differs from decaying at
// once, which is what Done takes out) is noise that decays for some
// seconds before it is 0. Left in, it was a peak that made its engine's
// other ranks win every tie against an idle engine's, so at light load
// calls kept to the engine that had last taken one instead of a coin flip.
func recentPrefill(e *endpoint, nowNs int64) float64 {
	if t := e.prefill.at(nowNs); t >= prefillFloor {
		return t
	}
	return 0
}

// setEngines points every endpoint at the ranks of its data-parallel
// engine, or at none. Engines are each membership's own: the members it
// gives the same label value, as it describes them. Memberships of a
// shared Balancer (channels to different fleets, or a channel and an HTTP
// transport) may each number their engines from "0", so one value in two
// memberships is two engines. An endpoint that several memberships put in
// an engine (the same replica, reached both ways) is a rank of each: its
// peers are their union. An engine of one has no barrier. Called by
// reconcile with mu held, after eps has every member.
func (b *Balancer) setEngines() {
	peers := map[*endpoint][]*endpoint{}
	for _, m := range b.memberships {
		if m == nil {
			continue
		}
		engines := map[string][]*endpoint{}
		for i, e := range m.members {
			// Trimmed, as a model label's names are: " 0" and "0" are one engine.
			if v := strings.TrimSpace(m.infos[i].Labels[b.cfg.dpLabel]); v != "" {
				engines[v] = append(engines[v], e)
			}
		}
		for _, ranks := range engines { // a member is in one engine here: order is moot
			if len(ranks) < 2 {
				continue
			}
			for _, e := range ranks {
				old, ok := peers[e]
				if !ok {
					peers[e] = ranks // shared by the engine's ranks; never appended to in place
					continue
				}
				merged := slices.Clip(old)
				for _, r := range ranks {
					if !slices.Contains(merged, r) {
						merged = append(merged, r)
					}
				}
				peers[e] = merged
			}
		}
	}
	for _, e := range b.eps {
		if p, ok := peers[e]; ok {
			e.dpPeers.Store(&p)
		} else {
			e.dpPeers.Store(nil)
		}
	}
	b.engines.Store(len(peers) > 0)
}
