package metrics_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/metrics"
	"github.com/inferlb/inferlb/telemetry"
)

type noPollerStats struct{}

func (noPollerStats) Stats() telemetry.PollerStats { return telemetry.PollerStats{} }

type noTransportStats struct{}

func (noTransportStats) Stats() httpbalancer.TransportStats { return httpbalancer.TransportStats{} }

var (
	fqName     = regexp.MustCompile(`fqName: "([^"]+)"`)
	seriesName = regexp.MustCompile(`\binferlb_[a-z_]*[a-z]\b`)
)

// registered is every series name the package's collectors describe.
func registered(t *testing.T) map[string]bool {
	t.Helper()
	b := balancer.New(balancer.Options{})
	t.Cleanup(func() { b.Close() })
	names := map[string]bool{}
	for _, c := range []prometheus.Collector{
		metrics.NewCollector(b, "b"),
		metrics.NewStoreCollector(b.Telemetry(), "s"),
		metrics.NewPollerCollector(noPollerStats{}, "p"),
		metrics.NewTransportCollector(noTransportStats{}, "t"),
	} {
		ch := make(chan *prometheus.Desc, 64)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("no fqName in %s", d)
			}
			names[m[1]] = true
		}
	}
	return names
}

// TestDocumentedSeriesAreRegistered checks the series the package doc lists
// for dashboards and alerts against what the collectors register, both
// ways, and every inferlb_ series the README and the root package doc name:
// a renamed series, or one added without a word, would otherwise leave
// dashboards built from the docs reading nothing.
func TestDocumentedSeriesAreRegistered(t *testing.T) {
	have := registered(t)

	src, err := os.ReadFile("metrics.go")
	if err != nil {
		t.Fatal(err)
	}
	// The package doc's list: from "The series" to the first blank comment
	// line after the TransportCollector's names.
	doc, _, _ := strings.Cut(string(src), "\npackage metrics")
	_, list, ok := strings.Cut(doc, "The series, for dashboards")
	if !ok {
		t.Fatal("metrics.go: the package doc's list of series was not found")
	}
	list, _, _ = strings.Cut(list, "inferlb_http_idle_close_resends_total")
	list += "inferlb_http_idle_close_resends_total"
	list = strings.ReplaceAll(list, "\n//", " ")
	list = regexp.MustCompile(`\{[^}]*\}`).ReplaceAllString(list, "") // label sets
	list = regexp.MustCompile(`\([^)]*\)`).ReplaceAllString(list, "") // notes
	// Each section names its first series in full and the rest by suffix.
	prefix := map[string]string{
		"Collector,":          "inferlb_endpoint_",
		"StoreCollector,":     "inferlb_telemetry_",
		"PollerCollector,":    "inferlb_telemetry_poll_",
		"TransportCollector,": "inferlb_http_",
	}
	documented := map[string]bool{}
	cur := ""
	for _, f := range strings.FieldsFunc(list, func(r rune) bool { return r == ' ' || r == ',' || r == ';' || r == ':' || r == '\t' }) {
		if p, ok := prefix[f+","]; ok {
			cur = p
			continue
		}
		switch {
		case strings.HasPrefix(f, "inferlb_"):
			documented[f] = true
		case strings.HasPrefix(f, "_") && cur != "":
			documented[cur+f[1:]] = true
		}
	}
	if len(documented) < 20 {
		t.Fatalf("read only %d series from the package doc: %v", len(documented), documented)
	}
	for n := range documented {
		if !have[n] {
			t.Errorf("metrics.go's package doc lists %s, which no collector registers", n)
		}
	}
	for n := range have {
		if !documented[n] {
			t.Errorf("%s is registered but missing from metrics.go's package doc", n)
		}
	}

	// Every series named elsewhere in the docs.
	for _, file := range []string{"../README.md", "../doc.go", "../balancer/httpbalancer/doc.go", "../balancer/grpcbalancer/doc.go"} {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var missing []string
		for _, n := range seriesName.FindAllString(string(text), -1) {
			if !have[n] && !slices.Contains(missing, n) {
				missing = append(missing, n)
			}
		}
		if len(missing) > 0 {
			t.Errorf("%s names series no collector registers: %v", file, missing)
		}
	}
}
