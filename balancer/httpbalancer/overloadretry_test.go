package httpbalancer_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// refusingPair starts two fake chat servers; the one named by the
// returned pointer once it is set answers every call 429 with header (a
// Retry-After or retry-after-ms) set to value.
func refusingPair(t *testing.T, header, value string) (bs []*backend, refusing *atomic.Pointer[string]) {
	t.Helper()
	refusing = new(atomic.Pointer[string])
	for _, name := range []string{"a", "b"} {
		b := &backend{name: name}
		b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if p := refusing.Load(); p != nil && *p == b.name {
				_, _ = io.Copy(io.Discard, r.Body)
				b.hits.Add(1)
				w.Header().Set(header, value)
				http.Error(w, `{"error":{"message":"too many requests","type":"rate_limit_exceeded"}}`, http.StatusTooManyRequests)
				return
			}
			b.fakeChat(w, r)
		}))
		t.Cleanup(b.srv.Close)
		bs = append(bs, b)
	}
	return bs, refusing
}

// ownerOf makes one call and returns the name of the backend that took
// it: with affinity, the owner of every call of the same prompt.
func ownerOf(t *testing.T, client *http.Client, bs []*backend) string {
	t.Helper()
	before := []int64{bs[0].hits.Load(), bs[1].hits.Load()}
	resp, _ := post(t, client, chatBody(0, false))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	if bs[0].hits.Load() > before[0] {
		return bs[0].name
	}
	return bs[1].name
}

// Through the transport, with a fake clock: one replica answers every
// call 429 with Retry-After: 1, the other serves; the caller retries as
// the OpenAI SDKs do, at exactly Retry-After, three attempts in all, with
// 300 ms between calls. Every retry found the refusing replica back from
// its cooldown: with affinity (the same prompt, the same key) 8 of 30
// calls failed, all three attempts on it; without, 2. Now a replica that
// refuses the call sent at its Retry-After is second choice for a while,
// and no call fails.
func TestRetryAfterRetriesAvoidRefusingReplicaHTTP(t *testing.T) {
	for _, mode := range []balancer.AffinityMode{balancer.AffinityPrefer, balancer.AffinityOff} {
		t.Run(mode.String(), func(t *testing.T) {
			bs, refusing := refusingPair(t, "Retry-After", "1")
			clock := testutil.NewClock()
			tr := newTransport(t, httpbalancer.Options{
				Endpoints:       endpointsOf(bs...),
				BalancerOptions: balancer.Options{Clock: clock, Rand: testutil.NewRand(5), AffinitySeed: 1, Affinity: mode},
			})
			client := &http.Client{Transport: tr}
			owner := ownerOf(t, client, bs)
			refusing.Store(&owner)

			failed, refused := 0, 0
			for range 30 {
				served := false
				for attempt := range 3 {
					resp, _ := post(t, client, chatBody(0, false))
					if resp.StatusCode == http.StatusOK {
						served = true
						break
					}
					require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
					refused++
					if attempt < 2 {
						secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
						require.NoError(t, err)
						clock.Advance(time.Duration(secs) * time.Second)
					}
				}
				if !served {
					failed++
				}
				clock.Advance(300 * time.Millisecond)
			}
			t.Logf("%v: %d of 30 calls failed, %d attempts refused", mode, failed, refused)
			assert.Zero(t, failed)
			assert.LessOrEqual(t, refused, 6)
			assert.Zero(t, totalInFlight(tr.Balancer()))
		})
	}
}

// The official OpenAI client with its default retries, over loopback: the
// refusing replica sends retry-after-ms: 100, which openai-go honours,
// waiting exactly that, and the transport cools it down for those 100 ms
// (before it read the header, for DefaultCooldown, set to the same 100 ms
// here). 30 calls, the same prompt, 30 ms apart. Before the probation 8
// and 10 of 30 calls failed in two runs (affinity on); now none does: the
// second refusal in a row puts the replica on probation for twice its
// cooldown, past the SDK's next retry.
//
// The balancer runs on a fake clock, and so do the SDK's waits: a
// middleware between openai-go's retry loop and the transport hands the
// SDK each 429 with retry-after-ms: 0, so that it retries at once (the
// SDK's own retry, with its count and its replayed body), and advances
// the clock by the 100 ms the SDK would have slept before that retry's
// attempt goes out. Every retry then comes at exactly the end of the
// cooldown, as the SDK means it to, the case that failed, whatever the
// scheduling; on the wall clock, the SDK's sleep and the cooldown raced,
// with some 100 ms of margin to the probation's end.
func TestOpenAIClientRetriesAvoidRefusingReplica(t *testing.T) {
	bs, refusing := refusingPair(t, "retry-after-ms", "100")
	clock := testutil.NewClock()
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: endpointsOf(bs...),
		BalancerOptions: balancer.Options{
			Clock: clock, Rand: testutil.NewRand(5), AffinitySeed: 1,
			DefaultCooldown: 100 * time.Millisecond, MaxCooldown: time.Second,
		},
	})
	owner := ownerOf(t, &http.Client{Transport: tr}, bs)
	refusing.Store(&owner)
	// The middleware runs on the calling goroutine, one attempt at a time.
	var (
		wait    time.Duration // the SDK's wait before its next retry, taken from it
		retries int
	)
	waitOnClock := func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		if n := req.Header.Get("X-Stainless-Retry-Count"); n != "" && n != "0" {
			retries++
			clock.Advance(wait)
		}
		wait = 0
		resp, err := next(req)
		if err == nil && resp.Header.Get("retry-after-ms") != "" {
			ms, perr := strconv.Atoi(resp.Header.Get("retry-after-ms"))
			require.NoError(t, perr)
			wait = time.Duration(ms) * time.Millisecond
			resp.Header.Set("retry-after-ms", "0") // the transport read it already
		}
		return resp, err
	}
	client := openai.NewClient(
		option.WithHTTPClient(&http.Client{Transport: tr}),
		option.WithBaseURL("http://llm.internal/v1/"),
		option.WithAPIKey("unused"),
		option.WithMaxRetries(2), // the default, said
		option.WithMiddleware(waitOnClock),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	failed := 0
	for range 30 {
		_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:     "m",
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("question 0")},
			MaxTokens: openai.Int(16),
		})
		if err != nil {
			var apiErr *openai.Error
			require.True(t, errors.As(err, &apiErr), "%v", err)
			require.Equal(t, http.StatusTooManyRequests, apiErr.StatusCode)
			failed++
		}
		clock.Advance(30 * time.Millisecond) // the caller's pace
	}
	refused := bs[0].hits.Load()
	if owner == bs[1].name {
		refused = bs[1].hits.Load()
	}
	t.Logf("%d of 30 calls failed, %d attempts refused, %d retries", failed, refused, retries)
	require.Positive(t, retries, "openai-go retried no refusal: the test tests nothing")
	assert.Zero(t, failed)
	assert.Zero(t, totalInFlight(tr.Balancer()))
}
