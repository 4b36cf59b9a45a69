// Package tokenest holds the constants of the transports' token estimates,
// so that the HTTP transport's estimate from a request body and the gRPC
// policy's from a request message (grpcbalancer.UnaryEstimate) count a
// call alike and are capped alike.
package tokenest

// Max bounds the prompt and output token estimates of one request
// (4,194,304 tokens, about 16 MB of text): above the largest context
// window served today, so no real request is cut, while a made-up size
// counts on its endpoint's in-flight tokens as one request of the largest
// possible size, not as hundreds of them. httpbalancer.MaxTokenEstimate
// documents it.
const Max = 1 << 22

// BytesPerToken is the usual rule of thumb for English text under BPE
// tokenizers: about four bytes of text to a token. It only has to rank
// requests by size, not bill them.
const BytesPerToken = 4
