package fleetsim

// hashTable maps block hashes (never 0) to block indexes: open addressing
// with linear probing and backward-shift deletion, so heavy churn leaves no
// tombstones. It replaces a Go map on the simulator's hottest path.
type hashTable struct {
	keys []uint64 // 0 = empty
	vals []int32
	mask uint64
}

func newHashTable(n int) *hashTable {
	size := 16
	for size < 2*n {
		size <<= 1
	}
	return &hashTable{keys: make([]uint64, size), vals: make([]int32, size), mask: uint64(size - 1)}
}

func (t *hashTable) get(k uint64) (int32, bool) {
	for i := t.home(k); ; i = (i + 1) & t.mask {
		switch t.keys[i] {
		case k:
			return t.vals[i], true
		case 0:
			return 0, false
		}
	}
}

// put inserts k unless present; the table never holds more keys than blocks.
func (t *hashTable) put(k uint64, v int32) {
	for i := t.home(k); ; i = (i + 1) & t.mask {
		switch t.keys[i] {
		case k:
			return
		case 0:
			t.keys[i], t.vals[i] = k, v
			return
		}
	}
}

func (t *hashTable) del(k uint64) {
	i := t.home(k)
	for ; t.keys[i] != k; i = (i + 1) & t.mask {
		if t.keys[i] == 0 {
			return
		}
	}
	// Backward shift: pull later entries of the probe run into the hole.
	for j := (i + 1) & t.mask; t.keys[j] != 0; j = (j + 1) & t.mask {
		home := t.home(t.keys[j])
		if (j-home)&t.mask >= (j-i)&t.mask {
			t.keys[i], t.vals[i] = t.keys[j], t.vals[j]
			i = j
		}
	}
	t.keys[i] = 0
}

// home is k's first slot. Block hashes have their low bit forced to 1, so the
// low bit is dropped.
func (t *hashTable) home(k uint64) uint64 { return (k >> 1) & t.mask }
