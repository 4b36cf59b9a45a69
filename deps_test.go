package inferlb_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestCoreImportsNoTransport keeps the dependency direction of DESIGN.md:
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
