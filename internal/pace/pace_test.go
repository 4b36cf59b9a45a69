package pace

import "testing"

func TestReaderPaced(t *testing.T) {
	for _, tc := range []struct {
		waited, span int64
		want         bool
	}{
		{0, 0, false},     // one token, or all in one receive: nothing to judge
		{0, 100, true},    // every token was waiting
		{12, 100, true},   // waited under 1/8 of the span
		{13, 100, false},  // waited over 1/8: the endpoint's pace shows
		{100, 100, false}, // the reader waited for every token
	} {
		if got := ReaderPaced(tc.waited, tc.span); got != tc.want {
			t.Errorf("ReaderPaced(%d, %d) = %v, want %v", tc.waited, tc.span, got, tc.want)
		}
	}
}

func TestReaderLate(t *testing.T) {
	for _, tc := range []struct {
		away, waited, ttft int64
		want               bool
	}{
		{0, 50, 50, false},        // in the receive from the start
		{0, 0, 50, false},         // the first token came with the headers
		{6, 44, 50, false},        // came within 1/8 of the time to it
		{6, 0, 50, false},         // at once, but within 1/8: off by 6 at most
		{7, 0, 50, true},          // at once, over 1/8 late
		{1000, 0, 1000, true},     // came a second late and found it waiting
		{100, 0, 150, true},       // came late (over 1/8) and found it waiting
		{1000, 2000, 3000, false}, // came late, but waited for it
		{1000, 125, 1125, false},  // waited 1/8 of the time away: it came meanwhile
		{1000, 124, 1124, true},   // waited less: as likely found it waiting
		{-5, 60, 55, false},       // entered before a retried attempt began
	} {
		if got := ReaderLate(tc.away, tc.waited, tc.ttft); got != tc.want {
			t.Errorf("ReaderLate(%d, %d, %d) = %v, want %v", tc.away, tc.waited, tc.ttft, got, tc.want)
		}
	}
}
