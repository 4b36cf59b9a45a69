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
