package grpcbalancer_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc/balancer"

	"github.com/inferlb/inferlb/balancer/grpcbalancer"
)

// serviceConfigs finds the service configs a text shows in
// grpc.WithDefaultServiceConfig(`...`) calls.
var serviceConfigs = regexp.MustCompile("WithDefaultServiceConfig\\(`([^`]*)`\\)")

// configFragments finds a policy config's fields shown inline, in a code
// span of their own: `"orca": {"outOfBand": true}`.
var configFragments = regexp.MustCompile("`(\"[a-z][a-zA-Z]*\": [^`]+)`")

// TestDocumentedConfigsParse parses the policy configs that README.md and
// the package doc show, with the policy's own parser, so a renamed or
// retyped field cannot leave a config in the docs that a channel refuses.
func TestDocumentedConfigsParse(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	// The package doc's code is in comments: drop the comment markers.
	var docText strings.Builder
	var annotated []string // the commented config object, with its notes
	inObject := false
	for line := range strings.SplitSeq(string(doc), "\n") {
		code, ok := strings.CutPrefix(line, "//\t")
		if !ok {
			inObject = false
			docText.WriteString(strings.TrimPrefix(line, "//") + "\n")
			continue
		}
		docText.WriteString(code + "\n")
		if code == "{" {
			inObject = true
		}
		if inObject {
			if i := strings.Index(code, "//"); i >= 0 { // a note for the reader, not JSON
				code = code[:i]
			}
			annotated = append(annotated, code)
		}
	}

	p := balancer.Get(grpcbalancer.Name).(balancer.ConfigParser)
	parse := func(where, sc string) {
		t.Helper()
		var outer struct {
			LB []map[string]json.RawMessage `json:"loadBalancingConfig"`
		}
		if err := json.Unmarshal([]byte(sc), &outer); err != nil {
			t.Errorf("%s: not JSON: %v\n%s", where, err, sc)
			return
		}
		n := 0
		for _, entry := range outer.LB {
			if js, ok := entry[grpcbalancer.Name]; ok {
				n++
				if _, err := p.ParseConfig(js); err != nil {
					t.Errorf("%s: %v\n%s", where, err, js)
				}
			}
		}
		if n == 0 {
			t.Errorf("%s: no %q entry in %s", where, grpcbalancer.Name, sc)
		}
	}
	for _, src := range []struct {
		where string
		text  string
	}{{"README.md", string(readme)}, {"doc.go", docText.String()}} {
		found := serviceConfigs.FindAllStringSubmatch(src.text, -1)
		if len(found) == 0 {
			t.Errorf("%s: no service config found", src.where)
		}
		for _, m := range found {
			parse(src.where, m[1])
		}
	}
	// Fields the README names inline as the policy config spells them
	// (`"idByHost": true`): a key in lowerCamelCase, as the policy's are,
	// unlike a request body's snake_case fields quoted beside them.
	fragments := configFragments.FindAllStringSubmatch(string(readme), -1)
	if len(fragments) < 2 {
		t.Errorf("README.md: %d inline config fields found", len(fragments))
	}
	for _, m := range fragments {
		parse("README.md's inline "+m[1], `{"loadBalancingConfig": [{"inferlb": {`+m[1]+`}}]}`)
	}
	if len(annotated) < 10 {
		t.Fatalf("doc.go: the annotated config object was not found (%d lines)", len(annotated))
	}
	obj := strings.Join(annotated, "\n")
	parse("doc.go's annotated config", `{"loadBalancingConfig": [{"inferlb": `+obj+`}]}`)
}
