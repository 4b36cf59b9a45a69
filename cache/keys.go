package cache

import (
	"crypto/rand"
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// Message is one chat message as the affinity key sees it.
type Message struct {
	Role    string
	Content string
}

// Keyer computes affinity keys: seeded 64-bit hashes that are never 0 (0
// means "no affinity" in inferlb.Request). The zero Keyer is not usable; use
// NewKeyer. A Keyer is immutable and safe for concurrent use.
type Keyer struct {
	seed uint64
}

// NewKeyer returns a Keyer for seed. A seed of 0 draws a random one from
// crypto/rand, so keys cannot be predicted from outside the process.
func NewKeyer(seed uint64) *Keyer {
	if seed == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		seed = binary.LittleEndian.Uint64(b[:]) | 1
	}
	return &Keyer{seed: seed}
}

// Seed returns the seed in use.
func (k *Keyer) Seed() uint64 { return k.seed }

// Session returns the key for an explicit session or conversation ID.
func (k *Keyer) Session(id string) uint64 {
	if id == "" {
		return 0
	}
	d := xxhash.NewWithSeed(k.seed)
	_, _ = d.WriteString("session\x00")
	_, _ = d.WriteString(id)
	return nonZero(d.Sum64())
}

func nonZero(h uint64) uint64 {
	if h == 0 {
		return 1
	}
	return h
}
