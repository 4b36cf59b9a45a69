package inferlb_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// TestReadmeCitesTestsThatExist keeps README.md from citing tests and
// benchmarks that were renamed or deleted. A name cited on its own
// (`TestX`, `BenchmarkX`) must be a function of a _test.go file; each
// alternative of a `go test -run` or `-bench` pattern must select at least
// one function in the packages the command names, since go test runs a
// pattern that selects nothing as a silent "no tests to run".
func TestReadmeCitesTestsThatExist(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	funcs := testFuncsByDir(t)

	// Fenced blocks: each line of a shell block is a command; the rest of
	// the text is searched for inline code spans.
	var spans []string
	var text strings.Builder
	inFence, shell := false, false
	for line := range strings.SplitSeq(string(readme), "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
			shell = inFence && strings.TrimPrefix(line, "```") == "sh"
			continue
		}
		switch {
		case !inFence:
			text.WriteString(line + "\n")
		case shell:
			spans = append(spans, line)
		}
	}
	for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(text.String(), -1) {
		spans = append(spans, strings.ReplaceAll(m[1], "\n", " "))
	}

	cited := regexp.MustCompile(`^(Test|Benchmark)[A-Za-z0-9_]+$`)
	names, commands := 0, 0
	for _, span := range spans {
		if cited.MatchString(span) {
			names++
			if !anyFunc(funcs, nil, func(name string) bool { return name == span }) {
				t.Errorf("README.md cites %s, which no _test.go file defines", span)
			}
			continue
		}
		for _, cmd := range goTestCommands(span) {
			commands++
			checkGoTest(t, funcs, cmd)
		}
	}
	if names < 10 || commands < 10 {
		t.Fatalf("found %d cited names and %d go test commands in README.md: the parsing is broken", names, commands)
	}
}

// testFuncsByDir lists the Test, Benchmark, Example and Fuzz functions of
// every _test.go file in the module, by the file's directory.
func testFuncsByDir(t *testing.T) map[string][]string {
	t.Helper()
	decl := regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Example|Fuzz)[A-Za-z0-9_]*)\(`)
	funcs := map[string][]string{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(filepath.Dir(path))
		for _, m := range decl.FindAllStringSubmatch(string(src), -1) {
			funcs[dir] = append(funcs[dir], m[1])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return funcs
}

// anyFunc says whether a function in the package directories pkgs (all of
// them when pkgs is nil; "x/..." is x and everything under it) satisfies ok.
func anyFunc(funcs map[string][]string, pkgs []string, ok func(string) bool) bool {
	for dir, names := range funcs {
		if pkgs != nil && !slicesContainsPackage(pkgs, dir) {
			continue
		}
		for _, n := range names {
			if ok(n) {
				return true
			}
		}
	}
	return false
}

func slicesContainsPackage(pkgs []string, dir string) bool {
	for _, p := range pkgs {
		p = strings.TrimSuffix(strings.TrimPrefix(p, "./"), "/")
		if p == "" {
			p = "."
		}
		if rest, ok := strings.CutSuffix(p, "..."); ok {
			rest = strings.TrimSuffix(rest, "/")
			if rest == "" || rest == "." || dir == rest || strings.HasPrefix(dir, rest+"/") {
				return true
			}
			continue
		}
		if dir == p {
			return true
		}
	}
	return false
}

// goTest is one go test command: its -run and -bench patterns and packages.
type goTest struct {
	text, run, bench string
	pkgs             []string
}

// goTestCommands finds the go test commands in a span of shell text, with
// its single quotes undone (README's commands quote nothing else).
func goTestCommands(span string) []goTest {
	var cmds []goTest
	var cur *goTest
	words := shellWords(span)
	for i := 0; i < len(words); i++ {
		w := words[i]
		switch {
		case w == "go" && i+1 < len(words) && words[i+1] == "test":
			cmds = append(cmds, goTest{text: span})
			cur = &cmds[len(cmds)-1]
			i++
		case cur == nil:
		case w == "&&" || w == ";" || w == "|" || strings.HasPrefix(w, "#"):
			cur = nil
		case w == "-run" || w == "-bench":
			if i+1 < len(words) {
				i++
				if w == "-run" {
					cur.run = words[i]
				} else {
					cur.bench = words[i]
				}
			}
		case strings.HasPrefix(w, "-run="):
			cur.run = strings.TrimPrefix(w, "-run=")
		case strings.HasPrefix(w, "-bench="):
			cur.bench = strings.TrimPrefix(w, "-bench=")
		case strings.HasPrefix(w, "./") || w == ".":
			cur.pkgs = append(cur.pkgs, w)
		}
	}
	return cmds
}

// shellWords splits s at spaces outside single quotes.
func shellWords(s string) []string {
	var words []string
	var w strings.Builder
	quoted, inWord := false, false
	for _, r := range s {
		switch {
		case r == '\'':
			quoted, inWord = !quoted, true
		case (r == ' ' || r == '\t') && !quoted:
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

func checkGoTest(t *testing.T, funcs map[string][]string, cmd goTest) {
	t.Helper()
	if len(cmd.pkgs) == 0 {
		t.Errorf("README.md: %q names no package", cmd.text)
		return
	}
	for _, p := range cmd.pkgs {
		if !anyFunc(funcs, []string{p}, func(string) bool { return true }) {
			t.Errorf("README.md: %q: package %s has no tests", cmd.text, p)
		}
	}
	for _, f := range []struct{ pattern, prefix string }{{cmd.run, "Test"}, {cmd.bench, "Benchmark"}} {
		if f.pattern == "" || f.pattern == "^$" {
			continue
		}
		// go test splits a pattern into alternatives at its top-level "|",
		// then each alternative into levels at "/"; the first level selects
		// the top-level functions.
		for _, alt := range splitTop(f.pattern, '|') {
			alt = splitTop(alt, '/')[0]
			re, err := regexp.Compile(alt)
			if err != nil {
				t.Errorf("README.md: %q: pattern %q: %v", cmd.text, alt, err)
				continue
			}
			prefix := f.prefix
			if !anyFunc(funcs, cmd.pkgs, func(name string) bool {
				if prefix == "Test" && (strings.HasPrefix(name, "Example") || strings.HasPrefix(name, "Fuzz")) {
					return re.MatchString(name) // -run selects these too
				}
				return strings.HasPrefix(name, prefix) && re.MatchString(name)
			}) {
				t.Errorf("README.md: %q: %q selects no %s function in %v", cmd.text, alt, prefix, cmd.pkgs)
			}
		}
	}
}

// splitTop splits a regular expression at sep outside parentheses and
// brackets.
func splitTop(re string, sep rune) []string {
	var parts []string
	depth, start := 0, 0
	for i, r := range re {
		switch r {
		case '(', '[':
			depth++
		case ')', ']':
			depth--
		case sep:
			if depth == 0 {
				parts = append(parts, re[start:i])
				start = i + 1
			}
		}
	}
	return append(parts, re[start:])
}

// TestReadmeLinksResolve checks that every relative link in README.md names
// a file of the repository and every in-page link (#anchor) a heading, as
// GitHub makes anchors: lower case, punctuation dropped, spaces as hyphens,
// a repeated heading's anchor numbered.
func TestReadmeLinksResolve(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	anchors := map[string]bool{}
	inFence := false
	for line := range strings.SplitSeq(string(readme), "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		text.WriteString(line + " ")
		if h, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " "); ok && strings.HasPrefix(line, "#") {
			slug := strings.Map(func(r rune) rune {
				switch {
				case r == ' ':
					return '-'
				case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
					return unicode.ToLower(r)
				}
				return -1
			}, strings.TrimSpace(h))
			a := slug
			for i := 1; anchors[a]; i++ {
				a = fmt.Sprintf("%s-%d", slug, i)
			}
			anchors[a] = true
		}
	}
	links := regexp.MustCompile(`\]\(([^)\s]+)\)`).FindAllStringSubmatch(text.String(), -1)
	if len(links) < 10 || len(anchors) < 10 {
		t.Fatalf("found %d links and %d headings in README.md: the parsing is broken", len(links), len(anchors))
	}
	for _, m := range links {
		link := m[1]
		if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
			continue
		}
		path, frag, _ := strings.Cut(link, "#")
		if path == "" {
			if !anchors[frag] {
				t.Errorf("README.md links to #%s, which no heading makes", frag)
			}
			continue
		}
		if _, err := os.Stat(filepath.FromSlash(path)); err != nil {
			t.Errorf("README.md links to %s: %v", link, err)
		}
	}
}
