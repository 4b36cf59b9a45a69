package httpbalancer

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/inferlb/inferlb"
	ctxwindow "github.com/inferlb/inferlb/internal/window"
)

// A 400 (or TGI's 422, TEI's 413 or 422) that says the call is longer
// than the endpoint's context window for the model is the endpoint saying
// so before any work:
// vLLM's "This
// model's maximum context length is 4096 tokens. However, you requested
// 5000 tokens (4000 in the messages, 1000 in the completion)." (or, newer,
// "... your request has 5000 input tokens"), SGLang's "The input (5000
// tokens) is longer than the model's context length (4096 tokens).", TGI's
// "Input validation error: `inputs` tokens + `max_new_tokens` must be <=
// 4096. Given: 4000 `inputs` tokens and 1000 `max_new_tokens`" (or, for a
// prompt alone longer than its max-input-tokens, "`inputs` must have less
// than 4096 tokens. Given: 5000"; Hugging Face TEI's for an input longer
// than its max-input-length, with auto-truncate off, says the same),
// TensorRT-LLM's "Prompt length (5056) exceeds maximum sequence length
// (2048)" (or "... maximum input length (M)"). A limit on the prompt alone
// (TGI's max-input-tokens, TEI's max-input-length, TensorRT-LLM's input
// length) is reported with inferlb.Outcome.PromptWindow: the Balancer
// remembers it apart from the window and weighs only prompts against it.
// In a fleet
// whose replicas have different windows (started with different
// max-model-len, or on GPUs with room for different KV caches) another
// replica may take the call. The attempt is reported with
// inferlb.Outcome.ContextWindow (neither success nor failure; the Balancer
// remembers the window), the call's token counts become the ones the
// server gave, and the call goes on to an endpoint not remembered too
// small for it, under the rules of a call another endpoint does not serve
// the model of (see notServed): the body can be sent again, Failover is
// on, the retry budget allows, at most notServedHops endpoints. When it
// cannot, or no endpoint is left that might take it, the caller gets the
// refusal as it came, every byte of it. TGI answers every validation
// error, this one too, with 422 (vLLM, SGLang and TensorRT-LLM with 400),
// and TEI with 413 up to v1.8 (422 from v1.9, router/src/http/server.rs),
// so all three are read. Other 400s, 413s (TEI's batch size refusal, a
// proxy's body limit) and 422s, and those whose body is not of a known
// length up to maxNotServedBody, are answers like any other (the
// request's). A call without a model is read too (TEI's native /embed,
// /rerank and /predict bodies name none, its OpenAI-compatible
// /v1/embeddings does): the Balancer remembers its window under the key
// of calls that name none (see balancer's window.go). A refusal is
// believed only of a call whose own body carries no such text
// (carriesRefusal): servers copy an invalid field's value into their
// validation errors, and a caller could otherwise have any window it
// likes remembered for the endpoints that do.

// errTooLong is the Outcome.Err of a refused attempt when the caller's
// code panics while its retry is set up (see call.retry), or while the
// call's body is read again to check the refusal (refusalCarried); it wraps
// context.Canceled, blaming no endpoint.
var errTooLong = fmt.Errorf("inferlb: httpbalancer: the call is longer than the endpoint's context window: %w", context.Canceled)

// tooLong handles a 400, 413 or 422, to a call with a model or without
// one. It reads the body, which
// stays readable from resp.Body as it came, and when the body refuses the
// call as too long it reports the attempt so and, when it may, sets up
// the call's retry on another endpoint (with a retry, this attempt's
// response is closed).
func (c *call) tooLong(resp *http.Response, may bool, rb *reqBody) (retryAttempt, bool) {
	head, ok := c.readRefusal(resp)
	if !ok {
		return retryAttempt{}, false
	}
	window, prompt, output, promptOnly := ctxwindow.Refusal(head)
	if window <= 0 || c.refusalCarried(rb) {
		// A call whose own text reads as a refusal gets an answer like
		// any other (see carriesRefusal): no window is remembered, and the
		// call does not go on.
		return retryAttempt{}, false
	}
	// The tokens the server counted, which the retry's pick weighs
	// against the windows remembered; at least one past this window.
	ctxwindow.Fit(&c.info.Request, window, prompt, output, promptOnly)
	o := inferlb.Outcome{ContextWindow: window, PromptWindow: promptOnly, Model: c.info.Model}
	next, retried := c.retry(may, rb, errTooLong)
	if retried {
		c.goOn(resp, o, resp.StatusCode, &next)
		return next, true
	}
	// The caller reads the refusal as it came; the attempt is reported
	// now, and finish reports nothing more.
	c.ends.Or(endReported)
	reported := false
	defer func() {
		if !reported { // OnResult panicked: the response goes nowhere
			_ = resp.Body.Close()
		}
	}()
	c.reportNow(o, resp.StatusCode, false)
	reported = true
	return retryAttempt{}, false
}

// refused reports an attempt that an endpoint refused without doing any
// work (it does not serve the model, the call is longer than its window)
// and whose call goes on to next. Should Options.OnResult panic there,
// next's pick, made already, is finished on the way out (as canceled: it
// was never sent) and its body closed, so that no endpoint is left one
// call busier.
func (c *call) refused(o inferlb.Outcome, status int, next *retryAttempt) {
	reported := false
	defer func() {
		if !reported {
			next.pick.Done(inferlb.Outcome{Err: errNotSent})
			closeBody(next.body)
		}
	}()
	c.reportNow(o, status, true)
	reported = true
}

// refusalCarried is rb.carriesRefusal for this attempt's refusal. It reads
// the call's body again, by the caller's GetBody: a panic there finishes
// the pick on the way out, reported as when the retry's GetBody panics
// (errTooLong, blaming no endpoint). Left in flight, the endpoint stayed
// one call busier for good.
func (c *call) refusalCarried(rb *reqBody) bool {
	returned := false
	defer func() {
		if !returned {
			c.fail(errTooLong, false)
		}
	}()
	carried := rb.carriesRefusal(c.out.Header)
	returned = true
	return carried
}

// reportNow reports this attempt's outcome o (its Done, then OnResult).
func (c *call) reportNow(o inferlb.Outcome, status int, failedOver bool) {
	f := c.t.cfg.onResult
	if f != nil {
		o.Latency = c.pick.Elapsed() // as Done would measure it
	}
	c.pick.Done(o)
	if f != nil {
		f(Result{Endpoint: c.pick.ID(), Request: c.info.Request, Status: status, Outcome: o, FailedOver: failedOver, Resent: c.ends.Load()&endResent != 0})
	}
}

// maxCarriedCheck is the longest request body carriesRefusal reads; a
// longer one is not believed to be refused for its length. Its bytes
// were sent already, and the read comes only with a refusal.
const maxCarriedCheck = 32 << 20

// carriesRefusal reports whether the call's body holds text that reads as
// a context-window refusal, or may (it cannot be read again, or is longer
// than maxCarriedCheck): a server that copies an invalid field's value
// into its 400 or 422, as vLLM's, SGLang's and TGI's validation errors do,
// would answer such a call with that text, and every endpoint doing so
// would be remembered with a window the caller chose ("max_tokens": "This
// model's maximum context length is 10 tokens. ..." sent a model's calls
// to the replicas that do not copy it, 60 of 60). A body of a known
// refusal is read again only once an endpoint refused the call, from the
// caller's GetBody or the bytes the peek read. A body sent with a
// Content-Encoding (h, the request's header; gzip, which Triton's HTTP
// server decodes before it copies an input's name into its 400), or as a
// form (percent-encoded, or multipart, whose parts may be base64 or
// quoted-printable; FastAPI's Form fields take both), may: the text the
// server reads is not the bytes sent.
func (rb *reqBody) carriesRefusal(h http.Header) bool {
	if rb.orig == nil || rb.orig == http.NoBody {
		return false
	}
	if encoded(h) || formBody(h) {
		return true
	}
	if !rb.replayable() {
		return true // the rest went by unread
	}
	body, ok := rb.again()
	if !ok {
		return true
	}
	defer closeBody(body)
	carried, whole := ctxwindow.Carried(body.rc, maxCarriedCheck)
	return carried || !whole
}

// formBody reports whether a request's Content-Type is a form's:
// application/x-www-form-urlencoded or multipart/*.
func formBody(h http.Header) bool {
	ct := h.Get("Content-Type")
	return hasPrefixFold(ct, "application/x-www-form-urlencoded") || hasPrefixFold(ct, "multipart/")
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}
