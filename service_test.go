package inferlb_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
)

// Every name a configuration may give a service maps to it, whatever its
// case and surrounding spaces; String gives back the canonical name, which
// parses to the same service.
func TestParseServiceNamesAndAliases(t *testing.T) {
	for name, want := range map[string]inferlb.Service{
		"":              inferlb.ServiceUnknown,
		"unknown":       inferlb.ServiceUnknown,
		"llm":           inferlb.ServiceLLM,
		" Chat ":        inferlb.ServiceLLM,
		"generation":    inferlb.ServiceLLM,
		"completion":    inferlb.ServiceLLM,
		"COMPLETIONS":   inferlb.ServiceLLM,
		"embedding":     inferlb.ServiceEmbedding,
		"Embeddings":    inferlb.ServiceEmbedding,
		"embed":         inferlb.ServiceEmbedding,
		"rerank":        inferlb.ServiceRerank,
		"reranker":      inferlb.ServiceRerank,
		"\treranking\n": inferlb.ServiceRerank,
	} {
		got, err := inferlb.ParseService(name)
		require.NoError(t, err, "%q", name)
		assert.Equal(t, want, got, "%q", name)
		back, err := inferlb.ParseService(got.String())
		require.NoError(t, err)
		assert.Equal(t, got, back, "String of %q", name)
	}
	assert.Equal(t, []string{"unknown", "llm", "embedding", "rerank"},
		[]string{inferlb.ServiceUnknown.String(), inferlb.ServiceLLM.String(), inferlb.ServiceEmbedding.String(), inferlb.ServiceRerank.String()})
}

// A name that is no service fails, naming what was given and what is
// accepted; a value past the known services prints as a number, not as a
// neighbour's name.
func TestParseServiceRejectsUnknownNames(t *testing.T) {
	for _, name := range []string{"llms", "vision", "embedding-model", "re rank"} {
		got, err := inferlb.ParseService(name)
		require.Error(t, err, "%q", name)
		assert.Equal(t, inferlb.ServiceUnknown, got)
		assert.Contains(t, err.Error(), fmt.Sprintf("%q", name))
		assert.Contains(t, err.Error(), "llm, embedding, rerank")
	}
	assert.Equal(t, "Service(4)", inferlb.Service(inferlb.NumServices).String())
	assert.Equal(t, "Service(200)", inferlb.Service(200).String())
}

// An endpoint is known by its ID, and by its address when it has none.
func TestEndpointKey(t *testing.T) {
	assert.Equal(t, "r0", inferlb.Endpoint{ID: "r0", Addr: "10.0.0.5:8000"}.Key())
	assert.Equal(t, "10.0.0.5:8000", inferlb.Endpoint{Addr: "10.0.0.5:8000"}.Key())
	assert.Equal(t, "", inferlb.Endpoint{}.Key())
}

// Only the caller's own cancellation, however wrapped, is Canceled: a
// deadline or an endpoint's failure says something about the endpoint.
func TestOutcomeCanceled(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{context.Canceled, true},
		{fmt.Errorf("read body: %w", context.Canceled), true},
		{context.DeadlineExceeded, false},
		{errors.New("connection reset by peer"), false},
	} {
		assert.Equal(t, tc.want, inferlb.Outcome{Err: tc.err}.Canceled(), "%v", tc.err)
	}
}
