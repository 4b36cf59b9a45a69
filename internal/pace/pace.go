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
//
// The first token's time has the same flaw. A caller that gets the
// response and comes back to receive from it late (setting up, logging, a
// handoff to another goroutine) finds the first tokens already received:
// the first receive returns one at once, and the token came at some time
// between the response and that receive, nobody can tell when. Timed, an
// endpoint that sent its first token 50ms after the headers and one every
// 20ms read as 1s to the first token and, as the caller then caught up on
// the received tokens, 10ms a token: twice as fast at decoding as it is.
// Again the receive's wait tells: a receive that waited for the first
// token saw it come, however late it began.
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

// ReaderLate reports whether the time to a stream's first token, ttft as
// its reader received it, is the reader's: the reader was away from the
// stream for away of that time before the receive that delivered the
// token (the time since the stream began, at its response headers or once
// its request was sent, not spent waiting on it in a receive or for the
// headers), and that receive waited waited (any unit, the same for the
// three). It is the endpoint's when the reader was away
// for at most 1/8 of ttft (then off by that much at most, had the token
// been waiting), or when the receive waited at least 1/8 as long as the
// reader was away: a token already received returns at once however late
// the reader comes, so such a wait saw it come. When the reader was late,
// time to first token is unknown, and so is decode speed: the span from
// the first token to the last is short by as much as the first token's
// time is late.
func ReaderLate(away, waited, ttft int64) bool {
	return away*share > ttft && waited*share < away
}
