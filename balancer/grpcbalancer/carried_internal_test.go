package grpcbalancer

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
)

// carriesRefusal reads a message's strings as sent, and a message it
// cannot read as one that may carry a refusal.
func TestCarriesRefusal(t *testing.T) {
	const text = "unknown input: This model's maximum context length is 10 tokens."
	for _, tc := range []struct {
		name    string
		req     any
		carries bool
	}{
		{"none", nil, false},
		{"empty", &testgrpc.Empty{}, false},
		{"a plain payload", &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte("hello")}}, false},
		{"a refusal's text in a field", &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte(text)}}, true},
		{"in a nested message", &testgrpc.StreamingOutputCallRequest{Payload: &testgrpc.Payload{Body: []byte(strings.Repeat("x", 100<<10) + text)}}, true},
		{"raw bytes", []byte(text), true},
		{"raw bytes without", []byte("hello"), false},
		{"no message it can read", struct{ S string }{text}, true},
		{"longer than it reads", &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: make([]byte, maxCarriedCheck+1)}}, true},
	} {
		assert.Equal(t, tc.carries, carriesRefusal(tc.req), tc.name)
	}
}

type nopStream struct{ grpc.ClientStream }

func (nopStream) SendMsg(any) error { return nil }

// Keeping a stream's first message for the check costs its sends no
// allocation.
func TestStreamSendKeepsTheMessageWithoutAllocating(t *testing.T) {
	s := &timedStream{ClientStream: nopStream{}, st: &streamState{}}
	m := &testgrpc.Empty{}
	assert.Zero(t, testing.AllocsPerRun(100, func() { _ = s.SendMsg(m) }))
	assert.Same(t, m, s.st.firstMsg)
	assert.False(t, s.st.believed(), "more than one message sent")
}

// Once the interceptor returned, the message is the application's again:
// an attempt that ends later (an inner interceptor left it running) does
// not read it, and its refusal is not believed.
func TestARefusalAfterTheCallReturnedIsNotBelieved(t *testing.T) {
	st := &retryState{req: &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte("hello")}}}
	assert.True(t, st.believed())
	st.release()
	assert.False(t, st.believed())
	assert.Nil(t, st.req, "the message is not kept")
}
