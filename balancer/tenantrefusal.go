package balancer

import (
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// Client errors of one tenant's calls on one endpoint.
//
// An endpoint can refuse one tenant's calls only: during a key rollout
// tenant A's API key is not provisioned on replica r0 yet, and r0 answers
// A's calls 401 and everyone else's well. The endpoint's one share of
// client errors (clienterror.go) cannot say so. Over 4 replicas at 2,000
// embedding calls a second for 60 s, with A a tenth of the calls r0's
// share stayed below the gap and A's calls failed at 1 in 4 (2,979 of
// 12,000); with A 60% of them r0 was shunned for everyone and the other
// tenants drew 0.4% of their calls there instead of a quarter
// (TestTenantRefusedOnOneReplicaPassesItOverForThatTenantOnly, which
// runs both with and without the tenant named). So each answer that
// names its tenant (Outcome.Tenant) also counts for the tenant: its
// share of client errors over all its answers (an EWMA, refusalAlpha),
// and for each endpoint the number of its calls refused there in a row,
// with none served there between. Once that run is longer than a tenant
// refused at its share (plus refusalSlack, for the share's noise)
// wherever its calls go would make once in refusalChance runs (needRun:
// at least refusalMinRun), the tenant's picks pass the endpoint over for
// ErrorDecay, and its other tenants' picks go on as before. A's calls so
// lose 7 to 13 calls while the run builds up, and none but probes after.
// The memory is kept for ErrorDecay past the pass-over, so that the
// first call of the tenant's there when it ends (a probe), refused
// again, starts the next one at once: the tenant loses a call per
// ErrorDecay and caller, where a shunned endpoint takes one every few
// seconds (clientErrorGap). A call of the tenant's served there ends it.
// The endpoint's own share counts every refusal as before, and goes on
// shunning an endpoint that refuses everyone's calls.
//
// The share counts the run's own refusals, and the pick can send most of
// the tenant's calls to the endpoint that refuses them: r1 priced out by
// its latency, r2 and r3 in slow start, nine in ten of A's calls went to
// r0, A's share rose to 0.9, where no run is long enough, and A lost 180
// of 200 calls to r0, though the 20 that went elsewhere were all served
// (TestTenantRefusalWeighsItsCallsElsewhere). So the run is also
// weighed against the tenant's answers elsewhere since it began
// (refusalElsewhere): with k of them served and m refused, the endpoint
// is passed over too when a tenant refused alike everywhere would have
// its n calls there all among its n+m refused less often than
// refusalChance (refusalUnlikely, Fisher's exact test): with none
// refused elsewhere, a run of 31 and 6 served elsewhere, of 39 and 5, or
// of 68 and 4. A lost 39 (21 to 89 over seeds 1 to 40, median 49); 52
// (21 to 120, median 56) while the run was counted only to 31. Not a
// share put at (m+1)/(m+k+1) (A lost 28, 12 to 45), nor at Laplace's
// (m+1)/(m+k+2): one call served elsewhere then allowed a run of 28
// (17), and the pick sends few calls elsewhere when they carry an
// affinity key: a tenant bad at 50% to 90% everywhere, its calls under
// 0, 1 or 3 keys, had an endpoint passed over in 14 of 360 runs over 4
// and 8 endpoints, against 1 before the weighing and with it, 0 since the
// share needRun weighs a run against is at least the tenant's share
// elsewhere during the run (runShare)
// (TestTenantBadEverywhereWithOneAffinityKeyMarksNothing). The run is
// counted to refusalRunMax, 127, and no further: the test is asked at
// each refusal of each run, and its chance is at least exp(-k n/m), so
// a longer count lets it pass endpoints over for tenants refused more
// often elsewhere. Counted to 255, a run of 132 of a tenant bad at 90%
// everywhere, and one of 214 at 95% (of 240 runs at 80% and 95%), passed
// an endpoint over; counted to 127 none did, and none can be so passed
// over with 9.2 or more refusals counted elsewhere per call served there
// (TestRefusalUnlikelyNeverAboveTheFullCountsRate). Refusals elsewhere
// are counted in m only to the 63rd of their own run (refusalOwnRun): an
// endpoint that refused the tenant so many times in a row refuses it
// itself, as a second replica without its key does, and its refusals
// would hide the first's (TestTenantRefusalsOfAnotherLongRunAreItsOwn).
// A tenant bad at a rate p everywhere still has about p+p^2+...+p^63
// counted per call served elsewhere, 9.2 or more from p = 0.903: on
// average; a run's own counts vary about it, the fewer the more.
// With r0 and r1 both refusing A in the priced-out run (r1 answering in a
// millisecond) A lost 6,981 of 8,000 calls over those 40 seeds, against
// 7,298 with every refusal counted: when the two take nine in ten of its
// calls, few are served elsewhere to weigh their runs against. Counted
// only to the 31st, a tenant bad at 90% had an endpoint passed over in 2
// of the 360 runs. The sweeps:
// INFERLB_TENANT_SWEEP=1 go test -run TestTenantRefusalSweep -v ./balancer/.
// With no call served elsewhere during the run (k = 0) the share alone
// decides.
//
// A run, weighed against the tenant's share, and not one refusal nor a
// fixed count: a tenant sends bad calls of its own (a malformed body
// answered 400), refused by whichever endpoint they meet, and they must
// not pass an endpoint over for its good calls. With three in a row as
// the rule, a tenant with a third of its calls bad had its calls pushed
// off one endpoint after another (5,687 of 36,000 on one of 4, 13,159 on
// another); weighed, they stay spread, with a tenth, a third or all of
// them bad (TestTenantsOwnBadCallsKeepItsCallsSpread). Nor does the
// memory pass over more of a pool for one tenant than outlier ejection
// may hold out (MaxEjectedFraction, at least one), nor every endpoint a
// call could take: the tenant's calls are then picked as if nothing were
// remembered, but for a failover to only endpoints that refuse the
// tenant, which finds none: it would only fetch the refusal again, on
// the retry budget (TestTenantFailoverToOnlyTheRefusingEndpointFindsNone).
// Nor can it tell a tenant whose calls all go to endpoints that refuse
// it (a shard, TenantShardSize, whose members all lack its key) from one
// whose own key expired: its share says it is refused wherever it goes,
// none of its calls is served elsewhere, and nothing is passed over
// (TestShardMemberRefusingItsTenant,
// TestTenantRefusedEverywhereOrOftenMarksNothing).
//
// Tenants are request data, and the memory is bounded whatever the
// requests say: a table of refusalPairs (endpoint, tenant) entries and
// one of refusalTenants tenants (a pick consults the pairs only for a
// tenant the second holds), 41 KiB allocated at the first refusal that
// names a tenant, 4-way set associative with two choices as the
// not-served memory's (notserved.go), keyed by the tenant's hash seeded
// per process (the affinity Keyer's seed), so a client cannot aim a
// made-up name at a real tenant's entries. A flood of made-up tenants,
// refused everywhere, takes entries and evicts the oldest; but a
// tenant's entries are kept once one of its calls the memory steered
// was served elsewhere (a real tenant refused by one endpoint), and a
// full set gives up entries not kept first: made-up tenants, served
// nowhere, evict each other. With half the calls under ever new made-up
// names, A lost 263 of 12,000 calls to r0 without that, 2 with it
// (TestMadeUpTenantsKeepARealTenantsRefusal). A kept entry still lapses
// as any does.
//
// It costs a pick that names no tenant nothing, and one that names one
// an atomic load (the latest time any entry lapses, refusedAt) while
// nothing is remembered, a hash of the tenant and a few loads while some
// entry is live, and, while one of the tenant's own pairs is marked, a
// look at the sets of pairs that hold its marked pairs (refusalTable.marks:
// a few loads each, and a hash and a map lookup for each marked pair of
// the tenant's) and at members until one the pick may take is not passed
// over (the first, mostly): whatever the size of the group, where the
// count the cap needs took a look at each member (107 µs a pick over
// 4,096 endpoints; BenchmarkPickTenantRefused). A success that names a
// tenant costs the same but the look at the marks, plus an atomic add to
// its counts, and once in its entry's life, when the memory steered it,
// a look at its endpoint's pools to keep the tenant's pairs
// (tenantServed).

const (
	refusalPairs   = 1024 // (endpoint, tenant) pairs remembered
	refusalTenants = 256  // tenants remembered

	// refusalPairSets is the number of the pairs' sets; refusalBuckets
	// that of the buckets of tenants (refusalBucket) whose marked pairs'
	// sets the table notes together (refusalTable.marks).
	refusalPairSets = refusalPairs / lackWays
	refusalBuckets  = 256

	// A pair's entry: lackKept, refusalMarked, a 5-bit count of the
	// tenant's calls refused there in a row, to 31 (not 0 while a run
	// goes on; its whole length is in refusalTable.lens), a 17-bit tag,
	// and the time it lapses in lackNow's units. A tenant's entry:
	// lackKept, refusalMarked (one of its pairs was marked while the
	// entry lived), a 22-bit tag, and the time the last of its pairs
	// lapses; and, in a word of its own, its share of client errors.
	refusalMarked        = 1 << 62
	refusalCountShift    = 57
	refusalCountMask     = 1<<5 - 1
	refusalTagMask       = 1<<17 - 1
	refusalTenantTagMask = 1<<22 - 1

	// refusalAlpha weighs each answer in a tenant's share of client
	// errors; refusalChance is how unlikely a run must be, for a tenant
	// refused at that share wherever its calls go, to pass an endpoint
	// over (needRun); refusalSlack is added to the share for its noise.
	// A run is counted to refusalRunMax (refusalTable.lens) and weighed
	// by the share to refusalShareMax, as when the entry held the whole
	// count: longer runs pass an endpoint over only by the weighing
	// against the tenant's answers elsewhere (refusalUnlikely), whose
	// full count bounds the tenants it can pass one over for. A refusal
	// past the first refusalOwnRun of its run is not counted among the
	// tenant's refusals elsewhere (refusalElsewhere).
	refusalAlpha    = 0.05
	refusalChance   = 1e-6
	refusalSlack    = 0.1
	refusalMinRun   = 3
	refusalRunMax   = 1<<7 - 1
	refusalShareMax = refusalCountMask
	refusalOwnRun   = 63
)

// refusalTable is the memory. Readers load words; writers of entries hold
// mu. A tenant's share is updated by CAS without it, and its counts by an
// add: a success folded in while its slot passes to another tenant lands
// in the new tenant's share and counts (reset to 0 when the slot is
// taken), which errs by one answer.
type refusalTable struct {
	mu      sync.Mutex
	pairs   [refusalPairs]atomic.Uint64
	tenants [refusalTenants]atomic.Uint64
	shares  [refusalTenants]atomic.Uint64 // float64 bits, by the tenants' slot
	owners  [refusalPairs]atomic.Uint64   // serial of each pair's endpoint, by its slot; written with it under mu (tenantrefusal_stats.go)
	horizon uint64                        // as lackTable's: refusalHorizon
	hold    uint64                        // ErrorDecay in lackNow's units, rounded up
	looks   *atomic.Int64                 // for tests only (testhook.SetTenantLooks), nil in production: see look

	// The tenant's answers since its slot was taken, served<<32 |
	// refused (refusalServed), by the tenants' slot, reset with shares;
	// births[i] is takes when slot i was last taken; runs, by the pairs'
	// slot, the tenant's counts when the pair's run began (refusalRun),
	// and lens its length, read while the pair's entry counts a run.
	// Only tenantRefused reads them, under mu, to weigh a run against
	// the tenant's answers elsewhere meanwhile (refusalElsewhere).
	counts [refusalTenants]atomic.Uint64
	births [refusalTenants]uint16 // guarded by mu
	takes  uint16                 // guarded by mu
	runs   [refusalPairs]uint64   // guarded by mu
	lens   [refusalPairs]uint8    // guarded by mu: each pair's run, to refusalRunMax

	// Where a tenant's marked pairs are, so that a pick finds them
	// without looking at every member of its group (tenantMarks): for
	// each bucket of tenants (refusalBucket of the tenant's key), a bit
	// per set of pairs that holds a marked pair of one of the bucket's
	// tenants, or held one since the bucket's last mark (noteMark); and
	// the bucket of the tenant of each pair's slot, written with it
	// under mu. By the key's bucket, not the tenant's slot: a tenant
	// whose entry was evicted keeps its marks (see refusedTenants), and
	// they pass endpoints over again once its new entry is marked.
	marks  [refusalBuckets][refusalPairSets / 64]atomic.Uint64
	bucket [refusalPairs]uint8
}

// refusalBucket is the bucket of the tenant of key (refusalTable.marks).
func refusalBucket(key uint64) int { return int(key >> 32 % refusalBuckets) }

// needRun is how many of a tenant's calls in a row an endpoint must have
// refused, none served there between, to pass it over for the tenant
// whose share of client errors over all its answers is q: as many as
// make such a run less likely than refusalChance for an endpoint that
// refuses the tenant's calls no more often than q+refusalSlack, at least
// refusalMinRun; refusalRunMax+1 (never) when that takes more than
// refusalShareMax.
func needRun(q float64) uint64 {
	q += refusalSlack
	if q < 1 {
		if n := math.Ceil(math.Log(refusalChance) / math.Log(q)); n <= refusalShareMax {
			return uint64(max(n, refusalMinRun))
		}
	}
	return refusalRunMax + 1
}

// runShare is the share a run is weighed against by needRun: the
// tenant's share q, or its share of refusals among its answers
// elsewhere during the run, m of m+k (one more served, so that a first
// refusal elsewhere does not put it at 1), if that is higher. The share
// forgets in about 1/refusalAlpha answers, and a run at an endpoint that
// takes few of the tenant's calls (one of 16, or not its affinity key's
// owner) spans hundreds of its answers elsewhere: a tenant bad at 65%
// everywhere, its calls under 2 affinity keys over 16 endpoints, had its
// share dip to 0.42 during a run of 24 at one of them, while 139 of its
// 227 answers elsewhere meanwhile were refused, and the endpoint was
// passed over (7 of 340 runs so, seeds 21 to 60 and 61 to 360;
// TestTenantBadEverywhereOverManyEndpointsMarksNothing).
func runShare(q float64, k, m uint64) float64 {
	return max(q, float64(m)/float64(m+k+1))
}

// A tenant's counts word holds its served answers above refusalServed
// and its refused ones below, but for those refused past the first
// refusalOwnRun of their run: an endpoint that refused the tenant's
// calls so many times in a row refuses them itself, and its refusals
// say nothing of how the tenant's calls fare elsewhere. A run's word
// (refusalTable.runs) holds the low refusalRunBits of each, as they were
// when the run began, under the birth of the tenant's slot
// (refusalTable.births). Differences are taken modulo 1<<refusalRunBits:
// right while a run spans fewer of the tenant's answers than that.
const (
	refusalServed  = 1 << 32
	refusalRunBits = 24
	refusalRunMask = 1<<refusalRunBits - 1
)

// refusalRun returns the run word of a pair after a refusal that made its
// run n long: run is its word before, prev the run's length before (0
// for a new run), c the counts of its tenant, this refusal included if
// counted, and birth that of the tenant's slot. A new run, or one whose
// tenant's slot was taken since it began (its counts restarted, and the
// run's refusals are not in them), starts from c less the run's refusals
// counted in c (at most refusalOwnRun): the answers elsewhere are weighed
// from now on.
func refusalRun(run, prev, n, c uint64, birth uint16) uint64 {
	if prev == 0 || uint16(run>>48) != birth {
		return uint64(birth)<<48 | c>>32&refusalRunMask<<refusalRunBits | (c-min(n, refusalOwnRun))&refusalRunMask
	}
	return run
}

// refusalElsewhere returns the tenant's answers served (k) and refused (m) at
// other endpoints since run, a pair's run word, began: c is the tenant's
// counts and n the run's length, this refusal included. A call served
// where the pair's endpoint is ends the run, so those served are all
// elsewhere; of those refused, the run's first refusalOwnRun were here.
// Counts that disagree with the run (fewer refused than that: a slot
// passing to another tenant mid-answer) give 0, 0.
func refusalElsewhere(run, c, n uint64) (k, m uint64) {
	k = (c>>32 - run>>refusalRunBits) & refusalRunMask
	r := (c - run) & refusalRunMask
	if own := min(n, refusalOwnRun); r >= own {
		return k, r - own
	}
	return 0, 0
}

// refusalUnlikely reports whether a run of n refusals at one endpoint,
// while k of the tenant's calls were served and m refused elsewhere, is
// less likely than refusalChance for a tenant whose calls are refused
// alike wherever they go: of its n+m+k answers, n+m refused, the chance
// that the n at this endpoint are all among them, C(n+m, n)/C(n+m+k, n),
// whatever the tenant's rate (Fisher's exact test). It needs no share:
// one call served elsewhere never makes a full run unlikely (1 in 128),
// where a share put at (m+1)/(m+k+1) passed the endpoint over after 28.
// Never a run shorter than the share asks of a tenant that no endpoint
// refused (needRun(0): 6): the test holds for calls refused alike
// wherever they go, and a tenant's own bad calls need not be (one
// session's, a broken client's, sent where its affinity key goes, while
// the tenant's other calls are served elsewhere by the hundred).
func refusalUnlikely(n, k, m uint64) bool {
	if k == 0 || n < needRun(0) {
		return false
	}
	p := 1.0
	for i := range n {
		if p *= float64(n+m-i) / float64(n+m+k-i); p < refusalChance {
			return true
		}
	}
	return false
}

// refusalTag is the tag of entry w in its table: narrower than lackTag,
// to leave room for refusalMarked and, in pairs, the count.
func refusalTag(w uint64, pair bool) uint64 {
	if pair {
		return w >> lackTimeBits & refusalTagMask
	}
	return w >> lackTimeBits & refusalTenantTagMask
}

// refusalSets returns the sets of table for key and key's tag (never 0).
func refusalSets(table []atomic.Uint64, key uint64, pair bool) (lackSets, uint64) {
	s, tag := lackSet(table, key)
	if pair {
		return s, max(tag&refusalTagMask, 1)
	}
	return s, max(tag&refusalTenantTagMask, 1)
}

// refusalFind returns the slot of tag's live entry in sets and the entry.
func refusalFind(sets lackSets, tag, now, horizon uint64, pair bool) (*atomic.Uint64, uint64) {
	for _, set := range sets {
		for i := range set {
			if w := set[i].Load(); w != 0 && refusalTag(w, pair) == tag && !lackLapsed(w, now, horizon) {
				return &set[i], w
			}
		}
	}
	return nil, 0
}

// refusalSlot returns the slot of sets a new entry takes: a free or
// lapsed one, in the set with more of them, else of the live entries the
// one not kept and not a pass-over (pairs only) that lapses first, then
// those not kept, then any. Called with mu held.
func refusalSlot(sets lackSets, now, horizon uint64, pair bool) *atomic.Uint64 {
	rank := func(w uint64) uint64 {
		switch {
		case w == 0 || lackLapsed(w, now, horizon):
			return 0
		case w&lackKept != 0:
			return 3<<lackTimeBits | w&lackTimeMask
		case pair && w&refusalMarked != 0:
			return 2<<lackTimeBits | w&lackTimeMask
		}
		return 1<<lackTimeBits | w&lackTimeMask
	}
	var best *atomic.Uint64
	var bestRank uint64
	var nfree [2]int
	for k, set := range sets {
		for i := range set {
			if rank(set[i].Load()) == 0 {
				nfree[k]++
			}
		}
	}
	order := [2]int{0, 1}
	if nfree[1] > nfree[0] {
		order = [2]int{1, 0}
	}
	for _, k := range order {
		for i := range sets[k] {
			if r := rank(sets[k][i].Load()); best == nil || r < bestRank {
				best, bestRank = &sets[k][i], r
			}
		}
	}
	return best
}

// tenantIndex returns the index of slot s, the entry of the tenant of
// key, in t.tenants: s is in one of the two sets lackSet gives key.
func (t *refusalTable) tenantIndex(key uint64, s *atomic.Uint64) int {
	n := uint64(refusalTenants / lackWays)
	for _, base := range [2]int{int(key%n) * lackWays, int(key>>lackAltShift%n) * lackWays} {
		for i := base; i < base+lackWays; i++ {
			if &t.tenants[i] == s {
				return i
			}
		}
	}
	panic("inferlb: tenant entry outside its sets")
}

// foldShare folds an answer of the tenant in slot i of the tenants, a
// client error or not, into its share, and returns the share before it.
func (t *refusalTable) foldShare(i int, clientErr bool) float64 {
	x := 0.0
	if clientErr {
		x = 1
	}
	w := &t.shares[i]
	for {
		old := w.Load()
		q := math.Float64frombits(old)
		if w.CompareAndSwap(old, math.Float64bits(q+refusalAlpha*(x-q))) {
			return q
		}
	}
}

// look adds n, the members of a group or slots of pairs just looked at,
// to the tests' count (testhook.SetTenantLooks), which bounds the work of
// a tenant's pick without a clock. In production looks is nil: a load
// and a branch, on the tenant's paths only (marked, markedMember,
// tenantServed), nothing on a pick that names no tenant or while nothing
// is remembered.
func (t *refusalTable) look(n int) {
	if t.looks != nil {
		t.looks.Add(int64(n))
	}
}

// marked reports whether e's entry for the tenant of key tenant passes it
// over at now.
func (t *refusalTable) marked(e *endpoint, tenant, now uint64) bool {
	t.look(1)
	sets, tag := refusalSets(t.pairs[:], pairKey(e.serial, tenant), true)
	_, w := refusalFind(sets, tag, now, t.horizon, true)
	return w&refusalMarked != 0 && w&lackTimeMask > now+t.hold
}

// refusalHorizon is how far ahead of the time it is written, in units,
// an entry may lapse (lackLapsed): the two holds an entry lives, rounded
// up, plus stepTolerance. The not-served memory's horizon (lackHorizon:
// NotServedMemory or MaxEjectionTime) left entries written before a step
// back shorter than that live, passing the endpoint over for the tenant
// for the step on top of ErrorDecay (an hour's MaxEjectionTime held a
// 10-minute step's; TestTenantRefusalEndsAtAClockStepBack).
func refusalHorizon(hold uint64) uint64 {
	return 2*hold + uint64(stepTolerance>>lackUnitShift) + 2
}

// tenantRefused records e's refusal (a client error) of a call of
// tenant's at nowNs. It reports whether it began a pass-over of e for the
// tenant (EventTenantRefused).
func (b *Balancer) tenantRefused(e *endpoint, tenant string, nowNs int64) bool {
	t := b.refused.Load()
	if t == nil {
		hold := uint64(min(b.cfg.errorDecay, maxHold)>>lackUnitShift) + 1
		b.refused.CompareAndSwap(nil, &refusalTable{horizon: refusalHorizon(hold), hold: hold, looks: b.tenantLooks.Load()})
		t = b.refused.Load()
	}
	key, now := b.keyer.Tenant(tenant), lackNow(nowNs)
	// Lapses a pass-over's length past its own: see the top of the file.
	until := min(now+2*t.hold+1, lackTimeMask)
	t.mu.Lock()
	defer t.mu.Unlock()
	tsets, ttag := refusalSets(t.tenants[:], key, false)
	ts, tw := refusalFind(tsets, ttag, now, t.horizon, false)
	fresh := ts == nil
	if fresh {
		ts = refusalSlot(tsets, now, t.horizon, false)
	}
	ti := t.tenantIndex(key, ts)
	if fresh {
		t.shares[ti].Store(0)
		t.counts[ti].Store(0)
		t.takes++
		t.births[ti] = t.takes
	}
	tw = tw&(lackKept|refusalMarked) | ttag<<lackTimeBits | until
	ts.Store(tw)
	q := t.foldShare(ti, true)
	psets, ptag := refusalSets(t.pairs[:], pairKey(e.serial, key), true)
	ps, pw := refusalFind(psets, ptag, now, t.horizon, true)
	if ps == nil {
		ps = refusalSlot(psets, now, t.horizon, true)
	}
	i := t.own(pairKey(e.serial, key), ps, e.serial, refusalBucket(key))
	prev := uint64(0)
	if pw>>refusalCountShift&refusalCountMask != 0 {
		prev = uint64(t.lens[i])
	}
	n := min(prev+1, refusalRunMax)
	t.lens[i] = uint8(n)
	c := t.counts[ti].Load()
	if n <= refusalOwnRun {
		c = t.counts[ti].Add(1)
	}
	t.runs[i] = refusalRun(t.runs[i], prev, n, c, t.births[ti])
	k, m := refusalElsewhere(t.runs[i], c, n)
	w := (pw|tw)&lackKept | min(n, refusalCountMask)<<refusalCountShift | ptag<<lackTimeBits | until
	began := false
	if n >= needRun(runShare(q, k, m)) || refusalUnlikely(n, k, m) {
		w |= refusalMarked
		ts.Store(tw | refusalMarked)
		began = pw&refusalMarked == 0 || pw&lackTimeMask <= now+t.hold
	}
	ps.Store(w)
	if w&refusalMarked != 0 {
		t.noteMark(refusalBucket(key), i/lackWays)
	}
	untilNs := later(nowNs, time.Duration(2*t.hold+2)<<lackUnitShift)
	for {
		cur := b.refusedAt.Load()
		if cur >= untilNs || b.refusedAt.CompareAndSwap(cur, untilNs) {
			break
		}
	}
	return began
}

// tenantServed folds a call of tenant's that e served at nowNs into the
// tenant's share, if it has an entry, and ends e's entry for it; steered
// says the memory passed some endpoint over for the call
// (pickTenantKeep): tenant's entries are then kept.
func (b *Balancer) tenantServed(e *endpoint, tenant string, nowNs int64, steered bool) {
	t := b.refused.Load()
	if t == nil {
		return
	}
	key, now := b.keyer.Tenant(tenant), lackNow(nowNs)
	tsets, ttag := refusalSets(t.tenants[:], key, false)
	ts, _ := refusalFind(tsets, ttag, now, t.horizon, false)
	if ts == nil {
		return
	}
	ti := t.tenantIndex(key, ts)
	t.foldShare(ti, false)
	t.counts[ti].Add(refusalServed)
	psets, ptag := refusalSets(t.pairs[:], pairKey(e.serial, key), true)
	ps, _ := refusalFind(psets, ptag, now, t.horizon, true)
	if ps == nil && !steered {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if ps, _ = refusalFind(psets, ptag, now, t.horizon, true); ps != nil {
		ps.Store(0)
	}
	ts, tw := refusalFind(tsets, ttag, now, t.horizon, false)
	if !steered || ts == nil || tw&lackKept != 0 {
		return
	}
	ts.Store(tw | lackKept)
	if pools := e.pools.Load(); pools != nil {
		for _, g := range *pools {
			t.look(len(g.members))
			for _, m := range g.members {
				sets, tag := refusalSets(t.pairs[:], pairKey(m.serial, key), true)
				if s, w := refusalFind(sets, tag, now, t.horizon, true); s != nil {
					s.Store(w | lackKept)
				}
			}
		}
	}
}

// noteMark notes that set, of the pairs' sets, holds a marked pair of a
// tenant of bucket bkt (refusalTable.marks), and stops noting the sets
// that no longer hold one: their marked pairs of the bucket's tenants
// were ended by a success or gave their slots up. Pairs that lapsed in
// time stay noted until their slots are taken: a clock stepped back may
// bring one back to life, for marked as for tenantMarks. Called with mu
// held: only writers change the bits.
func (t *refusalTable) noteMark(bkt, set int) {
	for wi := range t.marks[bkt] {
		old := t.marks[bkt][wi].Load()
		w := old
		for m := old; m != 0; m &= m - 1 {
			if s := wi*64 + bits.TrailingZeros64(m); !t.holdsMark(bkt, s) {
				w &^= 1 << (s % 64)
			}
		}
		if wi == set/64 {
			w |= 1 << (set % 64)
		}
		if w != old {
			t.marks[bkt][wi].Store(w)
		}
	}
}

// holdsMark reports whether set, of the pairs' sets, holds a marked pair
// of a tenant of bucket bkt, lapsed or not. Called with mu held.
func (t *refusalTable) holdsMark(bkt, set int) bool {
	for i := set * lackWays; i < (set+1)*lackWays; i++ {
		if t.pairs[i].Load()&refusalMarked != 0 && int(t.bucket[i]) == bkt {
			return true
		}
	}
	return false
}

// markedMember returns the member of g whose pair with the tenant of key
// is the one in slot i of the pairs, when marked reads that slot for
// them and it passes the member over at now; else nil. (A pair of
// another tenant's whose tag marked mistakes for this tenant's, one in
// 2^17 of those in the same sets, passes its member over for both, and
// is counted only when the two tenants share a bucket.)
func (t *refusalTable) markedMember(i int, key, now uint64, g *group) *endpoint {
	t.look(1)
	w := t.pairs[i].Load()
	if w&refusalMarked == 0 || w&lackTimeMask <= now+t.hold || lackLapsed(w, now, t.horizon) {
		return nil
	}
	serial := t.owners[i].Load()
	sets, tag := refusalSets(t.pairs[:], pairKey(serial, key), true)
	if refusalTag(w, true) != tag {
		return nil // another tenant's pair
	}
	if s, w := refusalFind(sets, tag, now, t.horizon, true); s != &t.pairs[i] || w&refusalMarked == 0 || w&lackTimeMask <= now+t.hold {
		return nil
	}
	j, ok := g.bySerial[serial]
	if !ok {
		return nil // an endpoint of another group, or one gone since
	}
	return g.members[j]
}

// tenantMarks sets c up to pass over the members of g that refused
// tenant's calls (c.refused, c.tenant), when some c allows are so marked,
// no more than MaxEjectedFraction of g (at least one), and another c
// allows is not. It leaves c as it was otherwise; then all reports
// whether every member c allows is so marked, no more than that
// fraction (a failover then has nowhere to go: see pickWith). Only picks
// made while some entry is live (refusedAt) call it, after the window
// filter (windowFilter): the members c passes over as too small for the
// call are none it allows, so a long call whose only members that fit
// refuse the tenant goes to one of them, not to one sure to refuse it as
// too long (TestTenantRefusalAndContextWindowTogether).
func (b *Balancer) tenantMarks(tenant string, g *group, c *cand) (all bool) {
	t := b.refused.Load()
	if t == nil {
		return false
	}
	key, now := b.keyer.Tenant(tenant), lackNow(c.nowNs)
	tsets, ttag := refusalSets(t.tenants[:], key, false)
	ts, tw := refusalFind(tsets, ttag, now, t.horizon, false)
	if ts == nil || tw&refusalMarked == 0 || tw&lackTimeMask <= now+t.hold {
		// No pair of the tenant's can pass an endpoint over: none was
		// marked while its entry lived (a tenant whose own bad calls
		// were refused here and there, the common case, scanned the
		// group on each of its picks for two ErrorDecays), or all
		// lapsed.
		return false
	}
	// The members c allows that the memory passes over for the tenant,
	// found from the sets of pairs its bucket noted, not by a look at
	// each member: a pick over 4,096 endpoints took 107 µs so.
	limit := max(int(b.cfg.maxEjected*float64(len(g.members))+1e-9), 1)
	bkt, marked := refusalBucket(key), 0
	for wi := range t.marks[bkt] {
		for m := t.marks[bkt][wi].Load(); m != 0; m &= m - 1 {
			set := wi*64 + bits.TrailingZeros64(m)
			for i := set * lackWays; i < (set+1)*lackWays; i++ {
				if e := t.markedMember(i, key, now, g); e != nil && c.ok(e) {
					if marked++; marked > limit {
						return false
					}
				}
			}
		}
	}
	if marked == 0 {
		return false
	}
	// Another member c allows and does not pass over: the first c
	// allows, mostly.
	other := false
	for _, e := range g.members {
		if c.ok(e) && !t.marked(e, key, now) {
			other = true
			break
		}
	}
	if !other {
		return true
	}
	c.refused, c.tenant, c.tenantKeep = t, key, tw&lackKept == 0
	return false
}
