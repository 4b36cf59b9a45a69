package grpcbalancer

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// watchReply wraps the codec gRPC uses: of several forced codecs, the
// last, whichever its kind (gRPC applies the options in order). Kills
// watchReply keeping an earlier V1 codec past a later ForceCodecV2: the
// call was encoded with the codec the caller overrode, JSON where it
// forced proto.
func TestWatchReplyWrapsTheCodecGRPCUses(t *testing.T) {
	for _, tc := range []struct {
		name     string
		opts     []grpc.CallOption
		v1       bool
		wantName string
	}{
		{"V1 forced, then V2", []grpc.CallOption{grpc.ForceCodec(jsonCodec{}), grpc.ForceCodecV2(encoding.GetCodecV2("proto"))}, false, "proto"},
		{"V2 forced, then V1", []grpc.CallOption{grpc.ForceCodecV2(encoding.GetCodecV2("proto")), grpc.ForceCodec(jsonCodec{})}, true, "JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &retryState{}
			got := st.watchReply(tc.opts)
			require.Len(t, got, len(tc.opts)+1)
			switch o := got[len(got)-1].(type) {
			case grpc.ForceCodecV2CallOption:
				assert.False(t, tc.v1, "wrapped a V2 codec")
				assert.Equal(t, tc.wantName, o.CodecV2.Name())
			case grpc.ForceCodecCallOption:
				assert.True(t, tc.v1, "wrapped a V1 codec")
				assert.Equal(t, tc.wantName, o.Codec.Name())
				assert.IsType(t, jsonCodec{}, st.codec.v1)
			default:
				t.Fatalf("last option %T", o)
			}
		})
	}
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
