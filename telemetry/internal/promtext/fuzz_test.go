package promtext_test

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/inferlb/inferlb/telemetry/internal/promtext"
)

// flat writes fams out one sample a line, sorted: what the adapters read
// of them (name, type, labels, value, timestamp).
func flat(fams promtext.Families) string {
	var lines []string
	for name, f := range fams {
		for _, m := range f.Metric {
			var b strings.Builder
			fmt.Fprintf(&b, "%s %v {", name, f.GetType())
			for _, l := range m.Label {
				fmt.Fprintf(&b, "%q=%q,", l.GetName(), l.GetValue())
			}
			v, ok := promtext.Value(m)
			fmt.Fprintf(&b, "} %v/%v h=%d/%v s=%d/%v ts", v, ok,
				m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum(),
				m.GetSummary().GetSampleCount(), m.GetSummary().GetSampleSum())
			if m.TimestampMs != nil {
				fmt.Fprintf(&b, "=%d", *m.TimestampMs)
			}
			lines = append(lines, b.String())
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

func samples(fams promtext.Families) int {
	n := 0
	for _, f := range fams {
		n += len(f.Metric)
	}
	return n
}

// FuzzParseSelected: whatever a scrape target answers, Parse does not
// panic (its recover would hide one as an error), leaves its input alone,
// builds at most MaxSamples metrics, and selecting lines changes nothing
// a clean parse reads: a keep that selects every name gives what Parse
// gives, and one that selects some names gives a subset of Parse's
// samples for those names.
func FuzzParseSelected(f *testing.F) {
	for _, s := range []string{
		"# TYPE a gauge\na 1\nb{x=\"y\"} 2\n",
		"a 1\nb{x=y} 2\nc 3\n",
		"# HELP a x\na 1\n# HELP a x\na{k=\"v\"} 2\n",
		"a 1\nb 12",
		"a 1\n# EOF",
		"# TYPE a gauge\r\na 1\r\n",
		"# TYPE c counter\nc_total 10.0 # {trace_id=\"abc\"} 0.5 1700000000.0\n# EOF\n",
		"# TYPE h histogram\nh_bucket{le=\"0.1\"} 2\nh_bucket{le=\"+Inf\"} 3\nh_count 3\nh_sum 0.4\n",
		"{\"a.b\", x=\"2\"} 4\n# TYPE \"a.b\" gauge\n",
		"temp{hash=\"#1\"} 41.5 1700000000.125\n",
		"  a{x=\"3\"} 5 1700000000000\n#comment\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		orig := bytes.Clone(data)
		all, _, allErr := promtext.Parse(data)
		if !bytes.Equal(data, orig) {
			t.Fatalf("Parse changed its input: %q to %q", orig, data)
		}
		if allErr != nil && strings.Contains(allErr.Error(), "panicked") {
			t.Fatalf("Parse(%q) panicked: %v", data, allErr)
		}
		if n := samples(all); n > promtext.MaxSamples {
			t.Fatalf("Parse built %d metrics, past MaxSamples", n)
		}
		every, _, everyErr := promtext.ParseSelected(data, func([]byte) bool { return true })
		if everyErr != nil && strings.Contains(everyErr.Error(), "panicked") {
			t.Fatalf("ParseSelected(%q, all) panicked: %v", data, everyErr)
		}
		if allErr == nil {
			if everyErr != nil {
				t.Fatalf("Parse(%q) is clean, ParseSelected with every name is not: %v", data, everyErr)
			}
			if a, e := flat(all), flat(every); a != e {
				t.Fatalf("Parse(%q):\n%s\nParseSelected with every name:\n%s", data, a, e)
			}
		}
		// Select the names that start with "a": a clean parse of them reads
		// the same samples as the whole exposition's clean parse does.
		some, _, someErr := promtext.ParseSelected(data, func(n []byte) bool { return len(n) > 0 && n[0] == 'a' })
		if someErr != nil && strings.Contains(someErr.Error(), "panicked") {
			t.Fatalf("ParseSelected(%q, some) panicked: %v", data, someErr)
		}
		if allErr == nil && someErr == nil {
			want := promtext.Families{}
			for name, fam := range all {
				if _, ok := some[name]; ok {
					want[name] = fam
				}
			}
			for name, fam := range some {
				// A family read whole, with its TYPE line, is the same; one
				// whose TYPE line names another family may read as untyped.
				if all[name] == nil || fam.GetType() != all[name].GetType() {
					delete(want, name)
					delete(some, name)
				}
			}
			if a, e := flat(want), flat(some); a != e {
				t.Fatalf("Parse(%q) read for the names selected:\n%s\nParseSelected:\n%s", data, a, e)
			}
		}
	})
}

// FuzzSampleValueMatchesParse: SampleValue, the adapters' quick read of
// one sample line, reads every sample Parse reads of a line, the same value
// under the same name; and it judges a value as Parse does: of a line that
// is a valid name and one token, it reads a value exactly when Parse does.
// (It checks no metric or label name, so of other lines it may read a
// value Parse refuses, and of a bare name with a character no name has,
// the parser reads another name.)
func FuzzSampleValueMatchesParse(f *testing.F) {
	for _, s := range []string{
		"a 3", "  a{x=\"} y\"} 1.5e9\r", "a{x=\"a b\"}7", "{\"vllm:x\", y=\"1\"} 2 1700000000.5 # {t=\"1\"} 1",
		"a{x=\"1\"} NaN", "a{x=\"1\"} twelve", "a{x=\"1\"", "# TYPE a gauge", "", "a +Inf", "a -inf 17",
		"vllm:lora_requests_info{running_lora_adapters=\"a\"} 1.7e9", "0x1p4", "1_0", "a 1 2 3", "a{} 1 # {} 2", "a {}0", "a {x=\"1\"} 5 1700000000.5",
	} {
		f.Add([]byte(s))
	}
	check := func(t *testing.T, line []byte, exact bool) {
		name, v, ok := promtext.SampleValue(line)
		fams, _, _ := promtext.Parse(append(bytes.Clone(line), '\n'))
		var family string
		var got []float64
		for n, fam := range fams {
			for _, m := range fam.Metric {
				family = n
				got = append(got, promtext.RawValue(m))
			}
		}
		switch {
		case len(got) > 1:
			t.Fatalf("Parse(%q) read %d samples of one line", line, len(got))
		case len(got) == 0 && ok && exact:
			t.Fatalf("%q: SampleValue reads %v, Parse nothing", line, v)
		case len(got) == 0:
		case !ok:
			t.Fatalf("%q: Parse reads %v, SampleValue nothing", line, got[0])
		case got[0] != v && !(math.IsNaN(v) && math.IsNaN(got[0])):
			t.Fatalf("%q: SampleValue %v, Parse %v", line, v, got[0])
		case !bytes.Contains(line, []byte(`\`)) && string(name) != family:
			// (a quoted name's escapes: keep sees it as written)
			t.Fatalf("%q: SampleValue names %q, Parse %q", line, name, family)
		}
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		if i := bytes.IndexByte(line, '\n'); i >= 0 {
			line = line[:i]
		}
		// expfmt ends a bare name at any character a name cannot have
		// ("a+1" is a, +1), where keep and SampleValue see one name: not
		// compared.
		// Nor is a line without a name ("{x}1"), which SampleValue says is
		// no sample line, and the parser may read.
		bare := bytes.TrimSpace(line)
		if j := bytes.IndexAny(bare, "{ \t"); j >= 0 {
			bare = bare[:j]
		}
		quoted := bytes.HasPrefix(bytes.TrimLeft(bytes.TrimSpace(line)[len(bare):], "{ \t"), []byte(`"`))
		if (len(bare) > 0 || quoted) && bytes.IndexFunc(bare, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == ':')
		}) < 0 {
			check(t, line, false)
		}
		// The line's first token as the value of a valid name.
		tok := bytes.TrimSpace(line)
		if i := bytes.IndexAny(tok, " \t"); i >= 0 {
			tok = tok[:i]
		}
		if !bytes.HasPrefix(tok, []byte("{")) { // a label set, not a value
			check(t, append([]byte("a "), tok...), true)
		}
	})
}
