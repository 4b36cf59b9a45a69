package balancer_test

import (
	"fmt"
	"testing"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
)

var benchSizes = []int{8, 64, 512, 4096}

// BenchmarkPick measures Pick+Done, serial and parallel, per fleet size and
// service (each service has its own scorer). Cost must be flat in n and
// allocation-free.
func BenchmarkPick(b *testing.B) {
	for _, svc := range []inferlb.Service{inferlb.ServiceLLM, inferlb.ServiceEmbedding} {
		for _, n := range benchSizes {
			bal := newBalancer(b, n, balancer.Options{})
			req := &inferlb.Request{Service: svc, PromptTokens: 512, MaxOutputTokens: 256}
			b.Run(fmt.Sprintf("%v/n=%d/serial", svc, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					p, err := bal.Pick(req)
					if err != nil {
						b.Fatal(err)
					}
					p.Done(inferlb.Outcome{})
				}
			})
			b.Run(fmt.Sprintf("%v/n=%d/parallel", svc, n), func(b *testing.B) {
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						p, err := bal.Pick(req)
						if err != nil {
							b.Fatal(err)
						}
						p.Done(inferlb.Outcome{})
					}
				})
			})
		}
	}
}
