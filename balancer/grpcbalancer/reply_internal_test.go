package grpcbalancer

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/encoding"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// unanswered reads the call's reply: a reply still its type's zero value
// had no message decoded into it.
// One decoded by gRPC's proto codec changed it, also when the message was
// empty (decoding records the message's type in its internal state: a
// protobuf release that stopped would fail "proto, empty message", and
// such calls would count as unanswered). A codec that leaves an empty
// message's reply as it was (encoding/json on "{}") cannot be told from
// none. A reply passed not empty (reused), or not a pointer, tells
// nothing: the call is answered, as it was before the interceptors read
// replies; so is one whose interceptor returned (the reply is the
// application's again).
func TestUnansweredReadsTheReply(t *testing.T) {
	type plain struct {
		Text string `json:"text"`
	}
	protoCodec := encoding.GetCodecV2("proto")
	filled, err := proto.Marshal(&testgrpc.SimpleResponse{Username: "u"})
	require.NoError(t, err)
	for _, tc := range []struct {
		name   string
		reply  any
		decode func(reply any) // nil: no message
		after  func(st *retryState)
		want   bool
	}{
		{name: "proto, no message", reply: &testgrpc.SimpleResponse{}, want: true},
		{name: "proto, a message", reply: &testgrpc.SimpleResponse{}, decode: func(r any) {
			require.NoError(t, protoCodec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(filled)}, r))
		}},
		{name: "proto, empty message", reply: &testgrpc.SimpleResponse{}, decode: func(r any) {
			require.NoError(t, protoCodec.Unmarshal(mem.BufferSlice{}, r))
		}},
		{name: "json, no message", reply: &plain{}, want: true},
		{name: "json, a message", reply: &plain{}, decode: func(r any) { require.NoError(t, json.Unmarshal([]byte(`{"text":"t"}`), r)) }},
		{name: "json, empty message", reply: &plain{}, decode: func(r any) { require.NoError(t, json.Unmarshal([]byte(`{}`), r)) }, want: true},
		{name: "reused reply", reply: &testgrpc.SimpleResponse{Username: "old"}},
		// Any reflective use of a generated reply before the call (a
		// pooled reply's Reset, proto.Size or String in a logging
		// interceptor) records its type, as decoding does: answered, the
		// conservative reading, whatever comes.
		{name: "proto, Reset before the call", reply: func() any { r := &testgrpc.SimpleResponse{}; r.Reset(); return r }()},
		{name: "proto, sized before the call", reply: func() any { r := &testgrpc.SimpleResponse{}; _ = proto.Size(r); return r }()},
		{name: "nil reply", reply: nil},
		{name: "nil pointer", reply: (*testgrpc.SimpleResponse)(nil)},
		{name: "map", reply: map[string]any{}},
		{name: "interceptor returned", reply: &testgrpc.SimpleResponse{}, after: (*retryState).release},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &retryState{method: "/grpc.testing.TestService/UnaryCall", reply: tc.reply}
			if tc.decode != nil {
				tc.decode(tc.reply)
			}
			if tc.after != nil {
				tc.after(st)
			}
			assert.Equal(t, tc.want, st.unanswered())
		})
	}
	reply := &testgrpc.SimpleResponse{}
	assert.Zero(t, testing.AllocsPerRun(100, func() { _ = zeroReply(reply) }), "allocations reading a reply")
}

// A stream whose first message came just as its caller cancelled it (the
// message received, the RecvMsg that waited for it not yet ended) was
// answered: unanswered reads the message before the wait. Kills
// streamState.unanswered not reading got: such a stream then counted as
// one given up on with nothing back.
func TestStreamWithItsFirstMessageInIsAnswered(t *testing.T) {
	clock := testutil.NewClock()
	b := core.New(core.Options{Clock: clock, Rand: testutil.NewRand(1)})
	t.Cleanup(b.Close)
	st := &streamState{}
	st.core.Store(b)
	start := clock.Now().UnixNano()
	st.from.Store(start)
	st.msgs = 1              // its request was sent
	st.awaiting.Store(start) // the application waits in RecvMsg from the start
	clock.Advance(30 * time.Second)
	require.True(t, st.unanswered(start), "waited 30 s with nothing")
	st.got.Store(true) // the message arrives; RecvMsg has not returned yet
	assert.False(t, st.unanswered(start), "a message came back")
}
