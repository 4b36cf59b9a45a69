// Package pace tells whether a token stream's timing measures the endpoint
// that generated it or the caller that read it.
//
// An adapter times a stream's tokens as the caller receives them. A caller
// that spends longer on each token than the endpoint takes to make one (an
// agent acting on each chunk, a relay to a slow client) finds the next
// tokens already received when it comes back for them: their spacing is its
// own pace, and the endpoint's decode speed is unknown (at least that fast,
// by how much nobody can tell). What tells the two apart is the time the
// caller spends waiting in its receive call (Read, RecvMsg) between the
// first token and the last: about all of that span when the endpoint sets
// the pace, about none of it when the caller does.
package pace

// share is the least fraction (1/share) of the span between the first and
// the last token a caller must have spent waiting for the stream to measure
// the endpoint. A caller a little faster than the endpoint waits (the
// endpoint's time per token - its own) per token, so a caller faster than
// 7/8 of the endpoint's pace still measures it, exactly; a slower one waits
// near nothing, whatever the jitter.
const share = 8

// ReaderPaced reports whether a stream whose tokens spanned span (first to
// last, in any unit) while its reader spent waited of it waiting to receive
// was paced by the reader.
func ReaderPaced(waited, span int64) bool { return waited*share < span }
