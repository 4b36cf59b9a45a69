package grpcbalancer

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc/balancer"
	_ "google.golang.org/grpc/balancer/leastrequest" // registers least_request_experimental
	_ "google.golang.org/grpc/balancer/ringhash"     // registers ring_hash_experimental
	_ "google.golang.org/grpc/balancer/roundrobin"   // registers round_robin
	"google.golang.org/grpc/metadata"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
)

// benchSizes are the fleet sizes every policy is measured at.
var benchSizes = []int{8, 64}

// benchKeys is how many distinct affinity keys the affinity benchmarks
// cycle through (a power of two, for masking).
const benchKeys = 1024

const benchMethod = "/ai.Gen/Chat"

// benchPickDone measures one Pick plus Done of the policy's picker on a
// fake ClientConn with n READY endpoints, cycling through infos.
func benchPickDone(b *testing.B, policy, cfg string, n int, infos []balancer.PickInfo) {
	h := newHarness(b, policy, cfg, n)
	p := h.picker()
	done := balancer.DoneInfo{BytesSent: true, BytesReceived: true}
	mask := len(infos) - 1
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		res, err := p.Pick(infos[i&mask])
		if err != nil {
			b.Fatal(err)
		}
		if res.Done != nil {
			res.Done(done)
		}
		i++
	}
}

// benchCore measures the core alone (Pick+Done on a Balancer with n
// endpoints, no gRPC), so the tables show what the adapter adds.
func benchCore(b *testing.B, n int, reqs []inferlb.Request) {
	bal := core.New(core.Options{})
	eps := make([]inferlb.Endpoint, n)
	for i := range eps {
		eps[i] = inferlb.Endpoint{Addr: addr(i)}
	}
	if err := bal.Update(eps); err != nil {
		b.Fatal(err)
	}
	mask := len(reqs) - 1
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		p, err := bal.Pick(&reqs[i&mask])
		if err != nil {
			b.Fatal(err)
		}
		p.Done(inferlb.Outcome{})
		i++
	}
}

// BenchmarkPickDone compares inferlb with grpc-go's own endpoint policies
// on calls that carry no affinity: the method is the only fact.
func BenchmarkPickDone(b *testing.B) {
	plain := []balancer.PickInfo{{FullMethodName: benchMethod, Ctx: context.Background()}}
	policies := []struct{ name, policy, cfg string }{
		{"inferlb", Name, `{"methods": {"/ai.Gen/": "llm"}}`},
		{"round_robin", "round_robin", `{}`},
		{"least_request", "least_request_experimental", `{}`},
	}
	for _, pol := range policies {
		for _, n := range benchSizes {
			b.Run(fmt.Sprintf("policy=%s/n=%d", pol.name, n), func(b *testing.B) {
				benchPickDone(b, pol.policy, pol.cfg, n, plain)
			})
		}
	}
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("policy=core-only/n=%d", n), func(b *testing.B) {
			benchCore(b, n, []inferlb.Request{{Service: inferlb.ServiceLLM}})
		})
	}
}

// BenchmarkPickDoneAffinity compares routing by a session key: inferlb
// reading it from outgoing metadata (as ring_hash does) or from a Request
// in the context, and ring_hash_experimental with requestHashHeader.
func BenchmarkPickDoneAffinity(b *testing.B) {
	header := make([]balancer.PickInfo, benchKeys)
	viaCtx := make([]balancer.PickInfo, benchKeys)
	for i := range header {
		key := fmt.Sprintf("conversation-%d", i)
		header[i] = balancer.PickInfo{FullMethodName: benchMethod,
			Ctx: metadata.AppendToOutgoingContext(context.Background(), "x-session-id", key)}
		viaCtx[i] = balancer.PickInfo{FullMethodName: benchMethod,
			Ctx: inferlb.NewContext(context.Background(), &inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: uint64(i)*0x9e3779b97f4a7c15 | 1})}
	}
	policies := []struct {
		name, policy, cfg string
		infos             []balancer.PickInfo
	}{
		{"inferlb-header", Name, `{"methods": {"/ai.Gen/": "llm"}, "affinityKeyHeader": "x-session-id"}`, header},
		{"inferlb-context", Name, `{"methods": {"/ai.Gen/": "llm"}}`, viaCtx},
		{"ring_hash", "ring_hash_experimental", `{"requestHashHeader": "x-session-id"}`, header},
	}
	for _, pol := range policies {
		for _, n := range benchSizes {
			b.Run(fmt.Sprintf("policy=%s/n=%d", pol.name, n), func(b *testing.B) {
				benchPickDone(b, pol.policy, pol.cfg, n, pol.infos)
			})
		}
	}
	reqs := make([]inferlb.Request, benchKeys)
	for i := range reqs {
		reqs[i] = inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: uint64(i)*0x9e3779b97f4a7c15 | 1}
	}
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("policy=core-only/n=%d", n), func(b *testing.B) {
			benchCore(b, n, reqs)
		})
	}
}
