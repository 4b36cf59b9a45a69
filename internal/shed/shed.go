// Package shed knows the texts with which model servers shed load: the
// answers they give, in place of a Retry-After or a RESOURCE_EXHAUSTED,
// when a request finds their queue full. The adapters read such an answer
// as an overload (the endpoint cools down), not as the endpoint's failure:
// counted as failures, a busy server's breaker opened after five and the
// fleet lost its replicas one by one under the load that needed them.
package shed

import (
	"bytes"
	"strings"
)

// The texts, as each server writes them.
const (
	// TritonQueueFull is Triton's, when a model's queue (dynamic
	// batching's max_queue_size) is full: UNAVAILABLE over gRPC, 503 over
	// HTTP (triton-inference-server/core, scheduler_utils.cc).
	TritonQueueFull = "Exceeds maximum queue size"
	// TritonQueueTimeout is Triton's when a request waited in the queue
	// past the queue policy's timeout (timeout_action REJECT;
	// dynamic_batch_scheduler.cc).
	TritonQueueTimeout = "Request timeout expired"
	// SGLangQueueFull is SGLang's at --max-queued-requests (scheduler.py,
	// _abort_on_queued_limit; code 503).
	SGLangQueueFull = "The request queue is full"
	// SGLangDisplaced is SGLang's, with priority scheduling, for a queued
	// request a higher-priority one took the place of.
	SGLangDisplaced = "The request is aborted by a higher priority request"
	// OllamaQueueFull ends Ollama's "server busy, please try again.
	// maximum pending requests exceeded", at OLLAMA_MAX_QUEUE (503).
	OllamaQueueFull = "maximum pending requests exceeded"
)

var texts = [...]string{TritonQueueFull, TritonQueueTimeout, SGLangQueueFull, SGLangDisplaced, OllamaQueueFull}

// In reports whether s, an error's message, holds one of the texts
// anywhere (a Triton ensemble puts where it failed before the text).
func In(s string) bool {
	for _, t := range texts {
		if strings.Contains(s, t) {
			return true
		}
	}
	return false
}

// InBytes is In for the start of an answer's body.
func InBytes(b []byte) bool {
	for _, t := range texts {
		if bytes.Contains(b, []byte(t)) {
			return true
		}
	}
	return false
}
