package httpbalancer_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

// TestCompressedStreamIsNotRead: a caller that sets Accept-Encoding itself
// gets the body as the server sent it, compressed (net/http's Transport
// decompresses only what it asked for). The transport does not read such a
// body: gzip at its fastest levels sends small flushes as stored blocks,
// whose plain text showed some events between block headers, so a stream
// of six tokens counted three, with a time to first token. The caller gets
// the compressed bytes unchanged and the call is a success with no events;
// a Content-Encoding of identity is read as plain.
func TestCompressedStreamIsNotRead(t *testing.T) {
	sse := "data: {\"a\":1}\n\ndata: {\"a\":2}\n\n"
	ndjson := `{"message":{"content":"a"},"done":false}` + "\n" + `{"message":{"content":"b"},"done":false}` + "\n"
	for _, s := range []struct {
		name, contentType, encoding, chunk string
		events                             int // when read
	}{
		{"SSE gzip", "text/event-stream", "gzip", sse, 0},
		{"SSE gzip, identity", "text/event-stream", "identity, gzip", sse, 0},
		{"NDJSON gzip", "application/x-ndjson", "gzip", ndjson, 0},
		{"SSE identity", "text/event-stream", "Identity", sse, 6},
	} {
		t.Run(s.name, func(t *testing.T) {
			var sent bytes.Buffer // what the server wrote, as it went on the wire
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", s.contentType)
				w.Header().Set("Content-Encoding", s.encoding)
				out := io.MultiWriter(w, &sent)
				var zw *gzip.Writer
				if s.encoding != "Identity" {
					zw, _ = gzip.NewWriterLevel(out, gzip.BestSpeed)
					out = zw
				}
				for range 3 {
					_, _ = io.WriteString(out, s.chunk)
					if zw != nil {
						_ = zw.Flush()
					}
					w.(http.Flusher).Flush()
				}
				if zw != nil {
					_ = zw.Close()
				}
			}))
			defer srv.Close()
			res := newResults(1)
			tr := newTransport(t, httpbalancer.Options{
				Endpoints: []inferlb.Endpoint{{ID: "e", Addr: strings.TrimPrefix(srv.URL, "http://")}},
				OnResult:  res.on,
			})
			req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(1, true)))
			require.NoError(t, err)
			req.Header.Set("Accept-Encoding", "gzip")
			resp, err := tr.RoundTrip(req)
			require.NoError(t, err)
			got, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			require.Equal(t, sent.Bytes(), got, "the body as the server sent it")
			r := <-res.c
			require.NoError(t, r.Outcome.Err)
			require.Equal(t, s.events, r.Events)
			require.Equal(t, s.events, r.Outcome.OutputTokens)
			if s.events == 0 {
				require.Zero(t, r.Outcome.TTFT)
			}
		})
	}
}

// TestCompressedRequestBodyIsForwarded: a request body the caller
// compressed (Content-Encoding: gzip) is not JSON to the inspector: it is
// sent on unchanged, with its header, and routed as a call that names no
// model, with no affinity key,
// also when gzip stores the JSON as it is (level 0, a stored block behind
// the gzip header).
func TestCompressedRequestBodyIsForwarded(t *testing.T) {
	for _, level := range []int{gzip.DefaultCompression, gzip.NoCompression} {
		var zb bytes.Buffer
		zw, err := gzip.NewWriterLevel(&zb, level)
		require.NoError(t, err)
		_, _ = io.WriteString(zw, `{"model":"m1","messages":[{"role":"user","content":"`+strings.Repeat("hello ", 500)+`"}],"stream":true}`)
		require.NoError(t, zw.Close())
		var got []byte
		var encoding string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got, _ = io.ReadAll(r.Body)
			encoding = r.Header.Get("Content-Encoding")
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{}`)
		}))
		res := newResults(1)
		tr := newTransport(t, httpbalancer.Options{
			Endpoints: []inferlb.Endpoint{{ID: "e", Addr: strings.TrimPrefix(srv.URL, "http://")}},
			OnResult:  res.on,
		})
		req, err := http.NewRequest(http.MethodPost, chatURL, bytes.NewReader(zb.Bytes()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Content-Encoding", "gzip")
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
		r := <-res.c
		require.Equal(t, zb.Bytes(), got, "level %d", level)
		require.Equal(t, "gzip", encoding)
		require.Empty(t, r.Request.Model)
		require.Zero(t, r.Request.AffinityKey)
		srv.Close()
	}
}
