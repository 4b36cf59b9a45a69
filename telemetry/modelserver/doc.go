// Package modelserver reads load from inference servers' own telemetry: the
// Prometheus /metrics of vLLM, SGLang, TensorRT-LLM, Triton, TGI,
// text-embeddings-inference (TEI) and llama.cpp's llama-server (--metrics),
// and vLLM's per-response ORCA load header (endpoint-load-metrics).
//
// ParseMetrics detects the engine from the metric names it finds, so one
// Source can scrape a mixed fleet. ParseLoadHeader (package loadheader's
// Parse, which carries none of this package's dependencies) is cheap enough
// for the response path: an HTTP transport calls it on every response that
// carries the header and publishes the result, which is fresher than any scrape.
//
// Besides load, ParseMetrics reads whether a vLLM server started with
// --enable-sleep-mode is asleep (telemetry.Asleep, from
// vllm:engine_sleep_state): a sleeping server reports no load and would
// otherwise read as the most idle endpoint, though it serves nothing
// until it is woken. Some vLLM releases export that gauge only with
// VLLM_SERVER_DEV_MODE=1 (which their /sleep endpoint needs too); a server
// put to sleep without it (through the engine's Python API) exports none,
// and reads as idle.
//
// Parsers leave Sample.Time zero: only the caller knows when the values were
// observed (the response's arrival, the scrape's start), so the caller stamps
// it before publishing; a telemetry.Store drops samples without a time. An
// exposition whose samples all carry a timestamp (Prometheus' /federate, a
// caching sidecar) says when it was measured itself: Parse stamps the oldest
// of them (a telemetry.Poller reads one ahead of its clock as now), so a
// served copy minutes old is as stale as it is.
//
// Malformed input never panics. When part of an input is unreadable the
// parsers return what they could read together with an error wrapping
// telemetry.ErrPartial.
package modelserver
