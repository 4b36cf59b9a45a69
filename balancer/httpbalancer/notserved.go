package httpbalancer

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/inferlb/inferlb"
)

// A 404 that names the call's model is the endpoint saying it does not
// serve that model: vLLM's `{"error": {"message": "The model `x` does not
// exist.", "type": "NotFoundError", "code": 404}}` from a replica that has
// not loaded the LoRA adapter x, Ollama's `{"error": "model \"x\" not found,
// try pulling it first"}`, OpenAI's "model_not_found". The server did no
// work, so the call goes on to another endpoint, as a call that failed
// before any response does (same conditions: the body can be sent again,
// Failover is on, the context is live and the retry budget allows), and
// the caller sees the other endpoint's answer; the balancer keeps the
// endpoint out of that model's picks for a while (balancer.Options.
// NotServedMemory), so later calls go straight to a replica that has it.
// Unlike a failover, this goes on past as many endpoints as the Transport
// has, less one (at least 8, at most 64: see notServedHops): the answers
// cost the servers nothing, and in a fleet where one replica of eight has
// the adapter, a single retry would fail most of the adapter's first calls
// (each hop passes over the endpoints met before: the last by PickRetry,
// the earlier ones by the memory). The retry budget bounds the hops as it
// bounds failovers, so made-up model names cannot multiply a client's
// calls; a hop draws it only down to a reserve kept for failover
// (balancer.Balancer.PickNotServedRetry), so a flood of made-up names
// does not leave a replica that dies without failover. When the call
// cannot go elsewhere, the caller gets the 404 as it came, every byte of
// it.
//
// A 404 whose body does not name the model (a route the server lacks,
// FastAPI's {"detail": "Not Found"}), or whose body is not of a known
// length up to maxNotServedBody, is a response like any other.

// minNotServedHops and maxNotServedHops bound how many endpoints without
// the model one call meets before its caller gets the 404 (notServedHops).
const (
	minNotServedHops = 8
	maxNotServedHops = 64
)

// notServedHops is how many endpoints without its model a call may meet:
// all the Transport's endpoints but one, so that a first call finds the
// one replica of a large fleet that has an adapter (12 replicas, one with
// it: a cap of 8 failed 5 of 20 new callers' first calls), within
// [minNotServedHops, maxNotServedHops]. With a shared Balancer whose
// endpoints another adapter set, the Transport counts none: 8.
func (t *Transport) notServedHops() int {
	return min(max(t.endpointCount()-1, minNotServedHops), maxNotServedHops)
}

// maxNotServedBody is the longest 404 body read for the model's name; the
// servers' answers are under 300 bytes.
const maxNotServedBody = 2048

// errNotServed is the Outcome.Err of a not-served attempt when the caller's
// code panics while its retry is set up (see call.retry); it wraps
// context.Canceled, blaming no endpoint.
var errNotServed = fmt.Errorf("inferlb: httpbalancer: the endpoint does not serve the model: %w", context.Canceled)

// notServed handles a 404 to a call with a model. It reads the body, which
// stays readable from resp.Body as it came, and when the body says the
// endpoint does not serve the model it marks the call so (finish reports
// it), and sets up the call's retry on another endpoint when it may (may:
// it has hops left). With a retry, this attempt is reported and its
// response closed.
func (c *call) notServed(resp *http.Response, may bool, rb *reqBody) (retryAttempt, bool) {
	head, ok := c.readRefusal(resp)
	if !ok || !namesMissingModel(head, c.info.Model) {
		return retryAttempt{}, false
	}
	c.ends.Or(endNotServed)
	next, ok := c.retry(may, rb, errNotServed)
	if !ok {
		return retryAttempt{}, false
	}
	c.goOn(resp, inferlb.Outcome{NotServedModel: c.info.Model}, http.StatusNotFound, &next)
	c.ends.And(^uint32(endNotServed))
	return next, true
}

// readRefusal reads the whole body of a refusal (a 404, a 400), when its
// length is known and at most maxNotServedBody, and leaves resp.Body
// readable as it came. ok reports that all of it was read. A body from
// Base that panics in Read panics through, as in the caller's Read; the
// attempt is finished on the way out, blaming no endpoint, so that the
// endpoint is not one call busier for good.
func (c *call) readRefusal(resp *http.Response) (head []byte, ok bool) {
	if resp.Body == nil || resp.ContentLength <= 0 || resp.ContentLength > maxNotServedBody {
		return nil, false
	}
	head = make([]byte, resp.ContentLength)
	returned := false
	defer func() {
		if !returned {
			c.fail(errBodyPanicked, false)
		}
	}()
	n, err := io.ReadFull(resp.Body, head)
	returned = true
	resp.Body = &readBack{head: head[:n], err: err, rc: resp.Body}
	return head, err == nil
}

// goOn closes the response of a refused attempt whose call goes on to
// next, and reports the attempt as o (see refused). A body that panics in
// Close panics through, with this attempt and next's pick, made already,
// finished on the way out (next's body closed, as it is never sent).
func (c *call) goOn(resp *http.Response, o inferlb.Outcome, status int, next *retryAttempt) {
	closed := false
	defer func() {
		if !closed {
			c.fail(errBodyPanicked, false)
			next.pick.Done(inferlb.Outcome{Err: errNotSent})
			closeBody(next.body)
		}
	}()
	_ = resp.Body.Close()
	closed = true
	c.refused(o, status, next)
}

// namesMissingModel reports whether a 404's body says model is not there:
// it names the model, quoted ("x", `x`, 'x', \"x\" inside a JSON string),
// and says "does not exist" or "not found" (or "not_found", "unknown
// model"), as the servers' answers do. The quotes keep a short name from
// matching inside other words of an unrelated 404.
func namesMissingModel(body []byte, model string) bool {
	if !quotes(body, model) {
		return false
	}
	lb := bytes.ToLower(body)
	for _, s := range [...]string{"does not exist", "not found", "not_found", "unknown model"} {
		if bytes.Contains(lb, []byte(s)) {
			return true
		}
	}
	return false
}

// quotes reports whether body holds s between quote marks of any kind.
func quotes(body []byte, s string) bool {
	quote := func(c byte) bool { return c == '"' || c == '`' || c == '\'' || c == '\\' }
	for off := 0; s != ""; off++ {
		i := bytes.Index(body[off:], []byte(s))
		if i < 0 {
			break
		}
		off += i
		if off > 0 && quote(body[off-1]) && off+len(s) < len(body) && quote(body[off+len(s)]) {
			return true
		}
	}
	return false
}

// readBack is a response body of which head was read already: it gives
// head, then err if reading it failed, then the rest of rc.
type readBack struct {
	head []byte
	err  error
	rc   io.ReadCloser
}

func (r *readBack) Read(p []byte) (int, error) {
	if len(r.head) > 0 {
		n := copy(p, r.head)
		r.head = r.head[n:]
		return n, nil
	}
	if r.err != nil {
		return 0, r.err
	}
	return r.rc.Read(p)
}

func (r *readBack) Close() error { return r.rc.Close() }
