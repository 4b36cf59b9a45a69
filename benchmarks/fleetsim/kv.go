package fleetsim

// blockPool is a replica's KV cache: a fixed number of fixed-size blocks with
// automatic prefix caching, after vLLM V1's BlockPool and KVCacheManager
// (https://docs.vllm.ai/en/latest/design/prefix_caching.html):
//
//   - A full block is identified by a chained hash: the hash of its parent
//     block's hash and its own tokens, so equal hashes mean equal prefixes.
//   - Blocks with no running reference stay in the cache (they keep their
//     hash) and sit in a free queue in least-recently-freed order; allocation
//     takes the head of that queue and evicts its hash, so the cache is LRU
//     over unreferenced blocks.
//   - A sequence frees its blocks tail first, so the end of a prompt is
//     evicted before the shared beginning, as in vLLM.
//
// It is single-threaded: one replica, one simulator goroutine.
type blockPool struct {
	ref    []int32
	hash   []uint64 // 0 = not a cached full block
	prev   []int32  // free queue links; -1 = none
	next   []int32
	inFree []bool
	head   int32 // least recently freed: evicted first
	tail   int32
	nFree  int
	cached *hashTable // hash -> block
}

func newBlockPool(n int) *blockPool {
	p := &blockPool{
		ref:    make([]int32, n),
		hash:   make([]uint64, n),
		prev:   make([]int32, n),
		next:   make([]int32, n),
		inFree: make([]bool, n),
		head:   -1,
		tail:   -1,
		cached: newHashTable(n),
	}
	for i := range n {
		p.pushFree(int32(i))
	}
	return p
}

// usage is vLLM's kv_cache_usage_perc: the fraction of blocks held by running
// sequences. Cached but unreferenced blocks count as free, as in vLLM.
func (p *blockPool) usage() float64 {
	if len(p.ref) == 0 {
		return 0
	}
	return 1 - float64(p.nFree)/float64(len(p.ref))
}

func (p *blockPool) pushFree(b int32) {
	p.inFree[b] = true
	p.prev[b] = p.tail
	p.next[b] = -1
	if p.tail >= 0 {
		p.next[p.tail] = b
	} else {
		p.head = b
	}
	p.tail = b
	p.nFree++
}

func (p *blockPool) removeFree(b int32) {
	if !p.inFree[b] {
		return
	}
	if p.prev[b] >= 0 {
		p.next[p.prev[b]] = p.next[b]
	} else {
		p.head = p.next[b]
	}
	if p.next[b] >= 0 {
		p.prev[p.next[b]] = p.prev[b]
	} else {
		p.tail = p.prev[b]
	}
	p.inFree[b] = false
	p.nFree--
}

// lookup returns how many leading hashes are cached, and how many of those
// blocks are currently unreferenced (they leave the free queue when touched,
// so they reduce what is left to allocate).
func (p *blockPool) lookup(hashes []uint64) (hit, idle int) {
	for _, h := range hashes {
		b, ok := p.cached.get(h)
		if !ok {
			break
		}
		hit++
		if p.ref[b] == 0 {
			idle++
		}
	}
	return hit, idle
}

// touch takes a reference on the cached blocks of hashes[:n] and appends them
// to table. The caller has checked them with lookup.
func (p *blockPool) touch(hashes []uint64, n int, table []int32) []int32 {
	for _, h := range hashes[:n] {
		b, _ := p.cached.get(h)
		p.removeFree(b)
		p.ref[b]++
		table = append(table, b)
	}
	return table
}

// alloc appends n fresh blocks to table, evicting the least recently freed
// cached blocks. It reports false, changing nothing, when fewer than n are free.
func (p *blockPool) alloc(n int, table []int32) ([]int32, bool) {
	if n > p.nFree {
		return table, false
	}
	for range n {
		b := p.head
		p.removeFree(b)
		if h := p.hash[b]; h != 0 {
			if c, _ := p.cached.get(h); c == b {
				p.cached.del(h)
			}
			p.hash[b] = 0
		}
		p.ref[b] = 1
		table = append(table, b)
	}
	return table, true
}

// release drops a sequence's references, tail first.
func (p *blockPool) release(table []int32) {
	for i := len(table) - 1; i >= 0; i-- {
		b := table[i]
		p.ref[b]--
		if p.ref[b] == 0 {
			if p.hash[b] == 0 {
				// Uncached blocks go to the head: they hold nothing worth keeping.
				p.pushFreeHead(b)
			} else {
				p.pushFree(b)
			}
		}
	}
}

func (p *blockPool) pushFreeHead(b int32) {
	p.inFree[b] = true
	p.prev[b] = -1
	p.next[b] = p.head
	if p.head >= 0 {
		p.prev[p.head] = b
	} else {
		p.tail = b
	}
	p.head = b
	p.nFree++
}

// register records that block b now holds the full block with hash h, and
// reports whether it did. When another block already holds h (two
// sequences computed the same prefix at once) the first stays canonical,
// as in vLLM.
func (p *blockPool) register(b int32, h uint64) bool {
	if p.hash[b] != 0 {
		return false
	}
	if _, dup := p.cached.get(h); dup {
		return false
	}
	p.hash[b] = h
	p.cached.put(h, b)
	return true
}

// unregister drops b's hash from the cache: its KV was never computed (the
// step that was to compute it was dropped). Unreferenced, it goes to the
// head of the free queue, as an uncached block does.
func (p *blockPool) unregister(b int32) {
	h := p.hash[b]
	if h == 0 {
		return
	}
	if c, _ := p.cached.get(h); c == b {
		p.cached.del(h)
	}
	p.hash[b] = 0
	if p.inFree[b] {
		p.removeFree(b)
		p.pushFreeHead(b)
	}
}

// idleHits counts the blocks among the leading cached hits of hashes that
// sit unreferenced in the free queue, which a sequence admitted now would
// take out of it (touch), and marks every block it walks (mark[b] == gen),
// so that a block several sequences hit counts once. The oracle router
// reads it, without side effects on the pool.
//
// The marked blocks of hashes are a prefix of it: a block is marked by a
// walk through every block before it, and equal hashes mean equal
// prefixes. So the walk starts after the last marked one, found by
// bisection: sequences queued behind a shared context walk it once.
func (p *blockPool) idleHits(hashes []uint64, mark []uint32, gen uint32) int {
	marked := func(k int) bool {
		b, ok := p.cached.get(hashes[k])
		return ok && mark[b] == gen
	}
	lo, hi := 0, len(hashes) // hashes[:lo] marked, hashes[hi:] not
	for lo < hi {
		if m := int(uint(lo+hi) >> 1); marked(m) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	n := 0
	for _, h := range hashes[lo:] {
		b, ok := p.cached.get(h)
		if !ok {
			break
		}
		mark[b] = gen
		if p.ref[b] == 0 {
			n++
		}
	}
	return n
}

// contains reports how many leading hashes are cached, without side effects;
// the oracle router reads it.
func (p *blockPool) contains(hashes []uint64) int {
	hit, _ := p.lookup(hashes)
	return hit
}

// flush empties the cache (a restarted replica comes back cold).
func (p *blockPool) flush() {
	n := len(p.ref)
	*p = *newBlockPool(n)
}
