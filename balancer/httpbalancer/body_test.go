package httpbalancer_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

// How the caller hands over a body: net/http treats each differently
// (ContentLength, GetBody, chunked framing).
const (
	knownLength  = iota // bytes.Reader: ContentLength and GetBody set
	unknownLen          // a plain io.Reader: chunked, no GetBody
	pipe                // written by another goroutine in small pieces
	binaryType          // Content-Type application/octet-stream: not peeked
	stringsBody         // strings.Reader: like known, another in-memory type
	bufferBody          // bytes.Buffer: like known, another in-memory type
	noGetBody           // bytes.Reader with GetBody cleared: the peek is kept for replays
	lengthOnly          // a plain io.Reader with ContentLength set: read ahead, length known
	wrapped             // as openai-go sends: a wrapper hides the in-memory reader; GetBody gives fresh copies
	rewinding           // GetBody rewinds the body's own reader and returns it again
	getBodyFails        // GetBody returns an error
	numBodyModes
)

var modeNames = [numBodyModes]string{"known", "unknown", "pipe", "binary", "strings", "buffer", "nogetbody", "lengthonly",
	"wrapped", "rewinding", "getbodyfails"}

// wrapper is a ReadCloser the transport cannot see into, as openai-go's
// closeOnceReadCloser.
type wrapper struct{ io.ReadCloser }

// onlyReader hides bytes.Reader's Len so net/http cannot learn the length.
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

// sendBody posts body in the given mode and checks the backend received
// exactly those bytes.
func sendBody(t testing.TB, client *http.Client, body []byte, mode int) {
	t.Helper()
	var r io.Reader
	switch mode {
	case knownLength, binaryType:
		r = bytes.NewReader(body)
	case stringsBody:
		r = strings.NewReader(string(body))
	case bufferBody:
		r = bytes.NewBuffer(slices.Clone(body))
	case noGetBody:
		r = bytes.NewReader(body)
	case lengthOnly:
		r = onlyReader{bytes.NewReader(body)}
	case unknownLen:
		r = onlyReader{bytes.NewReader(body)}
	case pipe:
		pr, pw := io.Pipe()
		go func() {
			piece := 7 // small pieces stress the peek's read loop
			if len(body) > 4096 {
				piece = 4096
			}
			for rest := body; ; {
				n := min(len(rest), piece)
				if _, err := pw.Write(rest[:n]); err != nil {
					return
				}
				rest = rest[n:]
				if len(rest) == 0 {
					_ = pw.Close()
					return
				}
			}
		}()
		defer pr.Close()
		r = pr
	}
	req, err := http.NewRequest(http.MethodPost, chatURL, r)
	require.NoError(t, err)
	switch mode {
	case binaryType:
		req.Header.Set("Content-Type", "application/octet-stream")
	case noGetBody:
		req.GetBody = nil
	case lengthOnly:
		req.ContentLength = int64(len(body))
		if len(body) == 0 {
			req.Body = http.NoBody
		}
	case wrapped, rewinding, getBodyFails:
		shared := bytes.NewReader(body)
		req.Body, req.ContentLength = wrapper{io.NopCloser(shared)}, int64(len(body))
		switch mode {
		case wrapped:
			req.GetBody = func() (io.ReadCloser, error) { return wrapper{io.NopCloser(bytes.NewReader(body))}, nil }
		case rewinding:
			req.GetBody = func() (io.ReadCloser, error) {
				_, err := shared.Seek(0, io.SeekStart)
				return io.NopCloser(shared), err
			}
		case getBodyFails:
			req.GetBody = func() (io.ReadCloser, error) { return nil, errors.New("no replay") }
		}
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	sum := sha256.Sum256(body)
	if got, want := resp.Header.Get("X-Body-Sha256"), hex.EncodeToString(sum[:]); got != want {
		t.Fatalf("mode %s, %d bytes: backend got %s bytes with sha256 %s, want %s",
			modeNames[mode], len(body), resp.Header.Get("X-Body-Len"), got, want)
	}
}

// bodyCases: JSON or not, empty, around and far over the peek limit.
func bodyCases(limit int) map[string][]byte {
	big := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 3*limit) + `"}]}`)
	return map[string][]byte{
		"empty":           {},
		"small json":      []byte(chatBody(1, false)),
		"not json":        []byte("\x00\xff hello \n\r\"{["),
		"exactly limit":   bytes.Repeat([]byte("a"), limit),
		"limit+1":         bytes.Repeat([]byte("b"), limit+1),
		"json over limit": big,
		"cut json":        big[:limit+limit/2],
	}
}

// TestBodyForwardedByteForByte runs every body case in every mode through
// a transport with a small peek (so "over the limit" is cheap to reach) and
// one with the default.
func TestBodyForwardedByteForByte(t *testing.T) {
	a := newBackend(t, "a")
	for _, limit := range []int{64, httpbalancer.DefaultMaxPeek} {
		tr := newTransport(t, httpbalancer.Options{Endpoints: endpointsOf(a), MaxPeek: limit})
		client := &http.Client{Transport: tr}
		for name, body := range bodyCases(limit) {
			for mode := range numBodyModes {
				t.Run(fmt.Sprintf("limit=%d/%s/%s", limit, name, modeNames[mode]), func(t *testing.T) {
					sendBody(t, client, body, mode)
				})
			}
		}
		require.Zero(t, totalInFlight(tr.Balancer()))
	}
}

// TestBodyForwardedAroundCallBuffers: bodies of known length just under, at
// and over each peek buffer that shares the call's allocation (used when
// the peek must outlive inspection, or the body is not in memory) arrive
// byte for byte, JSON or not, in each form of known length.
func TestBodyForwardedAroundCallBuffers(t *testing.T) {
	a := newBackend(t, "a")
	client := &http.Client{Transport: newTransport(t, httpbalancer.Options{Endpoints: endpointsOf(a)})}
	for _, size := range httpbalancer.CallBufSizes {
		for _, n := range []int{size - 2, size - 1, size, size + 1} {
			prefix := `{"model":"m","messages":[{"role":"user","content":"`
			body := []byte(prefix + strings.Repeat("x", n-len(prefix)-4) + `"}]}`)
			require.Len(t, body, n)
			for _, mode := range []int{knownLength, stringsBody, bufferBody, noGetBody, lengthOnly} {
				sendBody(t, client, body, mode)
				sendBody(t, client, bytes.Repeat([]byte{0xff}, n), mode)
			}
		}
	}
}

// FuzzBodyForwarded: any body, in any mode, arrives byte-identical.
func FuzzBodyForwarded(f *testing.F) {
	const limit = 64
	for _, b := range bodyCases(limit) {
		for mode := range numBodyModes {
			f.Add(b, uint8(mode))
		}
	}
	a := newBackend(f, "a")
	tr := newTransport(f, httpbalancer.Options{Endpoints: endpointsOf(a), MaxPeek: limit})
	client := &http.Client{Transport: tr}
	f.Fuzz(func(t *testing.T, body []byte, mode uint8) {
		sendBody(t, client, body, int(mode%numBodyModes))
	})
}

// TestReplayedLargeBodyClosesBoth: a body larger than the peek whose caller
// gave GetBody is sent from a fresh copy (so its model past the peek can be
// read); the copy goes to Base, which gets the whole body, and both the
// caller's body and the copy are closed, on success and when no endpoint
// can take the call.
func TestReplayedLargeBodyClosesBoth(t *testing.T) {
	body := `{"messages":[{"role":"user","content":"` + strings.Repeat("x", 200) + `"}],"model":"m"}`
	var sent []byte
	base := baseFunc(func(r *http.Request) (*http.Response, error) {
		var err error
		sent, err = io.ReadAll(r.Body)
		require.NoError(t, err)
		require.NoError(t, r.Body.Close())
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
	})
	for _, endpoints := range []int{1, 0} {
		eps := []inferlb.Endpoint{{Addr: "10.0.0.1:80", Labels: map[string]string{"model": "m"}}}
		tr := newTransport(t, httpbalancer.Options{Base: base, Endpoints: eps[:endpoints], MaxPeek: 64})
		caller := &closeTracker{Reader: strings.NewReader(body)}
		var replay *closeTracker
		req, _ := http.NewRequest(http.MethodPost, chatURL, caller)
		req.ContentLength = int64(len(body))
		req.GetBody = func() (io.ReadCloser, error) {
			replay = &closeTracker{Reader: strings.NewReader(body)}
			return replay, nil
		}
		sent = nil
		resp, err := tr.RoundTrip(req)
		if endpoints == 0 {
			require.ErrorIs(t, err, balancer.ErrNoEndpoints)
		} else {
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			assert.Equal(t, body, string(sent))
		}
		assert.True(t, caller.closed, "endpoints=%d: the caller's body", endpoints)
		require.NotNil(t, replay, "endpoints=%d", endpoints)
		assert.True(t, replay.closed, "endpoints=%d: the copy", endpoints)
	}
}
