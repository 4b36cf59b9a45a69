// Package cache computes affinity keys and places them on endpoints so that
// follow-up requests find the KV cache their predecessors left behind, and
// independent callers (every process that imports inferlb is its own router)
// agree on where each key lives without talking to each other.
//
// It has three parts, each usable alone: a Keyer turns a request into a
// 64-bit key, a Placement maps a key to its owner and spill order by
// consistent hashing, and Sessions remembers where explicit sessions went.
// The load bound that decides when a key spills lives in the balancer, which
// holds the live in-flight counts (balancer.Options.LoadBound);
// ExamplePlacement_Walk_boundedLoad applies one by hand. The package imports only the standard
// library and xxhash, and nothing on a request's path allocates.
//
// # Keys
//
// A key is a chained hash over BlockChars-byte blocks of the rendered
// prompt (about 32 tokens at 4 characters a token): block i is XXH64 seeded
// with the hash of block i-1, and block 0 with a hash of the Keyer seed and
// the model name, so the same text on another model, or under another seed,
// has unrelated keys. A chat renders each message as content, role and the
// two lengths; the encoding is injective, so different message lists, or one
// text split differently over messages, never render alike, while requests
// whose messages open with the same long text share its blocks, as their
// token streams share the engine's KV blocks.
//
// The key is the chain at one depth: for Chat, everything up to and
// including the first user message, of which at most Depth characters
// (DefaultDepth, 4 KiB, about 1,000 tokens) count, and at most MaxKeyChars
// (256 KiB) in all; for Prompt, the first Depth characters (all counted in
// bytes of UTF-8; a cut inside a character changes nothing). This is why:
//
//   - The turns of one conversation repeat everything through the first user
//     message verbatim, so they all route alike while the conversation grows.
//   - Conversations of one application share its system prompt, however long,
//     and differ in their first user message, so they spread over the fleet;
//     the system prompt is prefilled once per endpoint and then stays cached
//     there because every conversation uses it. Were the system prompt alone
//     to decide the key (a cap counting from the start), an agent with a
//     40 KB system prompt would pile all its conversations onto one owner.
//   - A first user message that opens with a long shared context (a RAG
//     document, a file, a transcript) followed by different questions is
//     cut at Depth, so such requests share a key and the context's KV cache
//     on the owner, and on the spills the balancer sends along the key's
//     walk when the owner is over its load bound. A context shorter than
//     Depth does not make them share a key; WithDepth tunes the trade-off.
//   - Plain prompts have no turns; prompts that agree on their first Depth
//     characters share a key.
//
// Blocks and PromptBlocks return the whole chain, one hash per complete
// block, for a longest-prefix index or a simulated KV cache.
//
// # Placement
//
// Placement is a consistent-hashing ring (Karger et al., "Consistent Hashing
// and Random Trees", STOC 1997) with PointsPerWeight = 100 points per unit of
// weight, 4 bytes a point, and a bucket index over the sorted points that
// makes a lookup one index read and a binary search over about 16 contiguous
// points, whatever the number of members. A Walk continues clockwise from the
// key, so the owner's spills go where the bounded-load algorithm of Mirrokni,
// Thorup and Zadimoghaddam ("Consistent Hashing with Bounded Loads", SODA
// 2018) sends them, and the keys of one member spill to the successors of its
// 100 points: over much of the fleet, not onto one neighbor.
//
// The ring was chosen by measurement over weighted rendezvous hashing (Thaler
// and Ravishankar, "Using Name-Based Mappings to Increase Hit Rates", 1998),
// Maglev's lookup table (Eisenbud et al., NSDI 2016) and multi-probe
// consistent hashing (Appleton and O'Reilly, 2015), all in this package's
// tests:
//
//	go test ./cache/ -run '^$' -bench PlacementWalk -benchtime=200000x -count 5
//	go test ./cache/ -run Figures -v -args -figures
//
// Lookup latency (Walk plus the first Next; each key depends on the last
// owner, as in a picker, and is pseudo-random; median of 5 runs on a 2-core
// AMD EPYC VM shared with other jobs; 0 allocs/op):
//
//	n             8     64    512    4096
//	ring         36     37     42     107 ns
//	rendezvous   74    319   2384   20615 ns   (O(n): one hash per member)
//
// The ring's lookup does the same work at every n: one index read and four
// steps of a branch-free binary search. What grows is the memory it reads at
// a random place (3.5 KB at n=8, 1.8 MB at n=4096), so at 4096 a lookup adds
// one or two cache misses, whose cost here depends on what the neighbors do
// to the shared L3: across runs n=4096 took 68 to 124 ns with dependent keys
// (1.9x to 3.4x of n=8) and 35 to 160 ns with independent ones
// (BenchmarkPlacementWalkIndependent, against 20 to 46 ns at n=8).
//
// Balance is the largest member's share of the key space over the mean, exact
// for the ring and sampled with 1,000 keys a member otherwise (so about 1.05-
// 1.1 of it is sampling noise); disruption is the fraction of 100,000 keys
// whose owner changed, in units of the minimum (1/n to remove one member,
// 1/(n+1) to add one):
//
//	                    max/mean share             remove 1 / add 1
//	n              16    64    512   4096      16          512         4096
//	ring V=100    1.13  1.20  1.32  1.38    0.80/0.95   0.87/1.02   0.94/1.07
//	rendezvous    1.05  1.06  1.12   -      1.00/1.00   0.93/1.02    -
//	maglev 65537  1.03  1.06  1.09  1.10    1.04/1.05   5.30/5.53   8.15/7.74
//
// Rendezvous is exact in weight and minimal in disruption, but O(n) per
// lookup and per spill step misses the O(1) lookups thousands of endpoints
// need. Maglev balances best and looks up in one read, but a fixed table
// (which cross-process agreement requires) moves 5-8 times the minimum at
// n >= 512. Multi-probe hashing with 21 probes balances a little better than
// the ring at n = 4096 (1.18) but costs 21 index lookups per key and a
// K-way merge to spill. The ring moves only the keys of the member that left
// or joined (but for a few in 100,000, see Placement), and its imbalance, 1/sqrt(100 x weight) per member, is what the
// balancer's load bound absorbs. 160 points a weight would give 1.27 at
// n = 4096 for 1.6x the memory and build time; 100 is the default.
//
// Where a point lands depends only on (seed, member ID, weight, the ring's
// scale), so two processes with the same seed and members agree on every
// key and every spill, in whatever order they list the members. Building
// the ring costs about 0.5 ms at n = 64 and 40 ms at n = 4096
// (BenchmarkNewPlacement).
//
// The ring's size follows the number of members, not their weights, which
// come from configuration or telemetry: a ring that would hold more than
// limit = max(MaxRingPoints, 100 n) points (MaxRingPoints = 2^20, 4 MiB)
// gives every member the same fraction of its points, limit over that
// total (rounded, at least one point), so it holds at most limit plus n
// points. A fleet whose weights are all 1 or less is never scaled. Weight
// ratios hold on the ring up to MaxWeight (four members of weight 1 beside
// one of 200 own 1/204 each). Each member keeps a prefix of its own
// points, so a change of the fraction moves only the keys of the points
// dropped or added, about the relative change of the fleet's total weight:
// one replica of weight 1,000 joining 20 moved 4.0% of the keys between
// the 20 (TestAutoscalerStepOnAScaledRingMovesFewKeys), where scaling by
// powers of two moved 44% at that step and none at most others; see
// Placement for the trade-off. Before the cap, 4,096 members of weight 64
// made a ring of 26 million points; with it, 1,048,576 points. Medians of 5
// runs on a 2-core AMD EPYC VM shared with other jobs (before: no cap;
// halving: the power-of-two scaling, 819,200 points at n = 4096; after:
// 2026-12-07, other jobs running):
//
//	go test -run '^$' -bench NewPlacementWeighted -benchmem -count 5 ./cache/
//
//	                  before              halving             after
//	n=512  w=64       579 ms   40.4 MB    117 ms   10.1 MB     98 ms   12.9 MB
//	n=512  w=1e6      537 ms   40.4 MB    108 ms    9.7 MB     91 ms   12.9 MB
//	n=4096 w=64       4.24 s   323 MB     134 ms   10.4 MB     92 ms   13.1 MB
//	n=4096 w=1e6      4.01 s   323 MB     134 ms    9.9 MB     87 ms   13.1 MB
//
// # Sessions
//
// Sessions is a fixed-size, set-associative table from session keys
// (Keyer.Session) to a 64-bit value, with an idle TTL and per-set LRU
// eviction, readable without locks. It is bounded in entries and bytes
// (DefaultMaxSessions 65,536 entries of SessionEntryBytes = 32 bytes: 2 MiB,
// allocated once), because session IDs come from requests.
//
// # Security
//
// Prompts and session IDs are untrusted. Keys are seeded (NewKeyer(0) draws
// a random seed; a fleet that wants cross-process agreement shares a secret
// one), so an outsider can neither predict which endpoint a prompt lands on
// nor aim a flood of keys at one endpoint or one session set. Work per key
// on the prompt is capped by MaxKeyChars (the model name, session ID,
// tenant and salt are hashed whole: work linear in what the caller has
// already read), and every table request data can reach is bounded.
// With the seed known, an attacker can still send many requests with one
// key; the balancer's load bound is what keeps that from overloading the
// owner.
package cache
