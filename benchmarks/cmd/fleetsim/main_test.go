package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func policyNames(c config) map[string][]string {
	out := map[string][]string{}
	for _, sc := range c.scenarios {
		for _, p := range sc.Policies {
			out[sc.Name] = append(out[sc.Name], p.Name)
		}
	}
	return out
}

// A policy name that matches nothing used to be dropped in silence: a typo
// in -policies printed tables without the policy, or no table at all, and
// a comparison could be published without the row it was run for.
func TestPoliciesNamingNoPolicyIsAnError(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-scenario", "shared-prefix", "-policies", "round-robin,inferlb-affinity"}, `-policies: no policy "inferlb-affinity" in scenario shared-prefix`},
		{[]string{"-scenario", "tenants", "-policies", "oracle"}, `-policies: no policy "oracle" in scenario tenants`},
		{[]string{"-scenario", "all", "-policies", "inferlb,orcale"}, `-policies: no policy "orcale" in any scenario`},
		{[]string{"-policies", " , "}, `-policies " , " names no policy`},
	} {
		var stderr bytes.Buffer
		_, err := parse(tc.args, &stderr)
		require.Error(t, err, "%q", tc.args)
		assert.Contains(t, err.Error(), tc.want, "%q", tc.args)
		assert.Contains(t, stderr.String(), tc.want, "%q: printed", tc.args)
	}
}

func TestPoliciesKeepsTheNamedOnesWhereTheyRun(t *testing.T) {
	c, err := parse([]string{"-scenario", "shared-prefix", "-policies", " round-robin ,inferlb -affinity,"}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, map[string][]string{"shared-prefix": {"round-robin", "inferlb -affinity"}}, policyNames(c))

	// With every scenario, a name needs to match in one of them; the
	// scenarios it matches nothing in are left out, not run empty.
	c, err = parse([]string{"-scenario", "all", "-policies", "inferlb shards=2"}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, map[string][]string{"tenants": {"inferlb shards=2"}}, policyNames(c))
	require.Len(t, c.scenarios, 1)
}

// Values the command cannot honour used to be replaced in silence: -clients
// 0 ran (and labelled) one client, -parallel 0 one run at a time; words
// after the flags were ignored, so "fleetsim mix -quick" ran the default
// scenario in full; and -clients was dropped for a scenario that fixes its
// own client counts.
func TestFlagValuesTheCommandCannotHonourAreErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-clients", "0"}, "-clients 0: must be at least 1"},
		{[]string{"-clients", "-8"}, "-clients -8: must be at least 1"},
		{[]string{"-parallel", "0"}, "-parallel 0: must be at least 1"},
		{[]string{"mix", "-quick"}, `unexpected argument "mix"`},
		{[]string{"-scenario", "mix", "-quick", "extra"}, `unexpected argument "extra"`},
		{[]string{"-scenario", "multi-client", "-clients", "4"}, "-clients 4: scenario multi-client runs 1 and 8 clients"},
	} {
		var stderr bytes.Buffer
		_, err := parse(tc.args, &stderr)
		require.Error(t, err, "%q", tc.args)
		assert.Contains(t, err.Error(), tc.want, "%q", tc.args)
		assert.Contains(t, stderr.String(), tc.want, "%q: printed", tc.args)
	}
	c, err := parse([]string{"-scenario", "shared-prefix", "-clients", "8", "-parallel", "3"}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, 8, c.clients)
	assert.Equal(t, 3, c.par)
	_, err = parse([]string{"-scenario", "all", "-clients", "8"}, &bytes.Buffer{})
	assert.NoError(t, err, "with every scenario, multi-client keeps its own and the rest take -clients")
}
