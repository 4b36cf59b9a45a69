package grpcbalancer_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// dnsServer answers every A query on loopback UDP with ips, and every
// other query with no records, until the test ends. It lets a test dial
// gRPC's own DNS resolver ("dns://<server>/name:port") with no custom
// resolver and nothing in /etc/hosts.
func dnsServer(t *testing.T, ips ...[4]byte) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return // closed at cleanup
			}
			var p dnsmessage.Parser
			h, err := p.Start(buf[:n])
			if err != nil {
				continue
			}
			q, err := p.Question()
			if err != nil {
				continue
			}
			b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionAvailable: true})
			b.EnableCompression()
			_ = b.StartQuestions()
			_ = b.Question(q)
			_ = b.StartAnswers()
			if q.Type == dnsmessage.TypeA {
				for _, ip := range ips {
					_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AResource{A: ip})
				}
			}
			if msg, err := b.Finish(); err == nil {
				_, _ = pc.WriteTo(msg, from)
			}
		}
	}()
	t.Cleanup(func() {
		pc.Close()
		<-done
	})
	return pc.LocalAddr().String()
}

// modelCalls makes calls EmptyCalls for model, waiting for ready.
func modelCalls(ctx context.Context, conn *grpc.ClientConn, model string, calls int) error {
	client := testgrpc.NewTestServiceClient(conn)
	ctx = metadata.AppendToOutgoingContext(ctx, "x-model", model)
	for range calls {
		if _, err := client.EmptyCall(ctx, &testgrpc.Empty{}, grpc.WaitForReady(true)); err != nil {
			return err
		}
	}
	return nil
}

// TestE2EConfigEndpointsRouteModelsOverDNS: a channel dialed with gRPC's
// stock DNS resolver, which gives addresses only, learns from the service
// config's "endpoints" which model each address serves: every call for
// model A goes to A's address, every call for model B to B's. Before
// "endpoints", this took a custom resolver calling WithEndpoint.
func TestE2EConfigEndpointsRouteModelsOverDNS(t *testing.T) {
	a := &backend{}
	a.start(t)
	_, port, _ := net.SplitHostPort(a.addr)
	b := &backend{addr: net.JoinHostPort("127.0.0.2", port)} // the name's two records, one port
	b.start(t)
	dns := dnsServer(t, [4]byte{127, 0, 0, 1}, [4]byte{127, 0, 0, 2})

	sc := fmt.Sprintf(`{"loadBalancingConfig": [{"inferlb": {
		"modelHeader": "x-model",
		"endpoints": {
			%q: {"labels": {"model": "llama-a"}},
			%q: {"labels": {"model": "llama-b,llama-b-lora"}}
		}}}]}`, a.addr, b.addr)
	conn, err := grpc.NewClient("dns://"+dns+"/fleet.test:"+port,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDisableServiceConfig(), // no TXT lookup: the default config below is the config
		grpc.WithDefaultServiceConfig(sc))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })

	ctx := testContext(t)
	const calls = 30
	for _, step := range []struct {
		model string
		to    *backend
	}{{"llama-a", a}, {"llama-b", b}, {"llama-b-lora", b}, {"llama-a", a}} {
		before := counts([]*backend{a, b})
		if err := modelCalls(ctx, conn, step.model, calls); err != nil {
			t.Fatalf("%s: %v", step.model, err)
		}
		after := counts([]*backend{a, b})
		got := map[*backend]int64{a: after[0] - before[0], b: after[1] - before[1]}
		if got[step.to] != calls {
			t.Fatalf("%d calls for %s: %d reached its server %s, %d the other (A %s, B %s)",
				calls, step.model, got[step.to], step.to.addr, calls-got[step.to], a.addr, b.addr)
		}
	}
}

// TestE2EConfigEndpointsWithPassthrough: the passthrough resolver's one
// address takes its description from "endpoints" too: a call for the
// model it serves succeeds, and one for another model fails at once,
// naming the model, rather than reaching a server that lacks it.
func TestE2EConfigEndpointsWithPassthrough(t *testing.T) {
	be := &backend{}
	be.start(t)
	sc := fmt.Sprintf(`{"loadBalancingConfig": [{"inferlb": {"modelHeader": "x-model",
		"endpoints": {%q: {"id": "replica-0", "labels": {"model": "llama"}}}}}]}`, be.addr)
	conn, err := grpc.NewClient("passthrough:///"+be.addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(sc))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx := testContext(t)
	if err := modelCalls(ctx, conn, "llama", 5); err != nil {
		t.Fatal(err)
	}
	client := testgrpc.NewTestServiceClient(conn)
	_, err = client.EmptyCall(metadata.AppendToOutgoingContext(ctx, "x-model", "mistral"), &testgrpc.Empty{})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), `no endpoint lists the requested model: "mistral"`) {
		t.Fatalf("a call for a model the address does not serve: %v, want UNAVAILABLE naming the model", err)
	}
	if got := be.calls.Load(); got != 5 {
		t.Fatalf("the server took %d calls, want the 5 for its model", got)
	}
}
