package shed

import "testing"

func TestIn(t *testing.T) {
	for _, tc := range []struct {
		s    string
		want bool
	}{
		{"Exceeds maximum queue size", true},
		{"in ensemble 'ensemble', [request id: <id_unknown>] Exceeds maximum queue size", true},
		{`{"error":"Request timeout expired"}`, true},
		{`{"object":"error","message":"The request queue is full.","code":503}`, true},
		{"The request is aborted by a higher priority request.", true},
		{`{"error":"server busy, please try again.  maximum pending requests exceeded"}`, true},
		{"Exceeds maximum queue", false},
		{"exceeds maximum queue size", false}, // servers write it as above
		{"Request for unknown model: 'm' is not ready", false},
		{"", false},
	} {
		if got := In(tc.s); got != tc.want {
			t.Errorf("In(%q) = %v, want %v", tc.s, got, tc.want)
		}
		if got := InBytes([]byte(tc.s)); got != tc.want {
			t.Errorf("InBytes(%q) = %v, want %v", tc.s, got, tc.want)
		}
	}
}
