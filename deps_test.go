package inferlb_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestCoreImportsNoTransport keeps the dependency direction of doc.go:
// the core packages never link gRPC or net/http, so they stay embeddable in
// any transport and cheap to build.
func TestCoreImportsNoTransport(t *testing.T) {
	core := []string{".", "./telemetry", "./scoring", "./cache", "./balancer"}
	args := append([]string{"list", "-deps", "-f", "{{.ImportPath}}"}, core...)
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	forbidden := []string{"google.golang.org/grpc", "net/http", "github.com/prometheus/", "gonum.org/"}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if dep == f || strings.HasPrefix(dep, f+"/") || strings.HasPrefix(dep, f) && strings.HasSuffix(f, "/") {
				t.Errorf("core package depends on %s", dep)
			}
		}
	}
}

// TestAdaptersImportNoMetricsStack keeps heavy dependencies at the edge: the
// gRPC policy and the HTTP transport, which every user links, never pull in
// the Prometheus client or parsers (telemetry sources and package metrics
// are opt-in), plotting, or an SDK.
func TestAdaptersImportNoMetricsStack(t *testing.T) {
	for _, pkg := range []string{"./balancer/grpcbalancer", "./balancer/httpbalancer"} {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, f := range []string{"github.com/prometheus/", "gonum.org/", "github.com/openai/"} {
				if strings.HasPrefix(dep, f) {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
		}
	}
}
