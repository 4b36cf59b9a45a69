package cache_test

import (
	"fmt"
	"math"

	"github.com/inferlb/inferlb/cache"
)

// A Placement says where a key belongs; a load bound says when a call of
// it goes elsewhere. The balancer applies the bound itself, with live
// in-flight counts (balancer.Options.LoadBound, default 1.25). A program
// using this package alone applies it along the key's Walk, as
// Mirrokni, Thorup and Zadimoghaddam do: the call goes to the first member
// in the key's order that stays within c times the mean load once it has
// the call. Some member is always at or below the mean, so the walk always
// finds one, and no call takes a member past c times the mean (rounded
// up), however hot its key.
func ExamplePlacement_Walk_boundedLoad() {
	members := []cache.Member{{ID: "gpu-a:8000"}, {ID: "gpu-b:8000"}, {ID: "gpu-c:8000"}, {ID: "gpu-d:8000"}}
	p := cache.NewPlacement(members, 0x5eed)
	key := cache.NewKeyer(0x5eed).Prompt("llama", "You are the support agent of ...")

	const c = 1.25
	load := make([]int, len(members)) // calls in flight on each member
	total := 0
	pick := func() int {
		bound := int(math.Ceil(c * float64(total+1) / float64(len(members))))
		w := p.Walk(key)
		for m, ok := w.Next(); ok; m, ok = w.Next() {
			if load[m]+1 <= bound {
				return m
			}
		}
		panic("unreachable: some member is at or below the mean")
	}

	var order []string
	w := p.Walk(key)
	for m, ok := w.Next(); ok; m, ok = w.Next() {
		order = append(order, members[m].ID)
	}
	fmt.Println("owner, then spills:", order)

	// A burst of 12 calls of one hot key, none finished yet: each member
	// in the key's order takes calls up to the bound (here 4, for a mean
	// of 3) before the next one does, so the key's calls stay on as few
	// members as the bound allows, and the last in its order has none.
	for range 12 {
		m := pick()
		load[m]++
		total++
	}
	fmt.Println("in flight:", load)
	// Output:
	// owner, then spills: [gpu-d:8000 gpu-c:8000 gpu-a:8000 gpu-b:8000]
	// in flight: [4 0 4 4]
}
