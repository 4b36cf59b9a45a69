package grpcbalancer

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
)

// jsonCodec is a V1 codec (encoding.Codec), as older custom codecs are.
type jsonCodec struct{}

func (jsonCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
func (jsonCodec) Name() string                       { return "JSON" }

// oldCodec is a deprecated grpc.Codec, whose content-subtype gRPC does
// not take from it.
type oldCodec struct{ jsonCodec }

func (oldCodec) String() string { return "old" }

// watchReply wraps the codec gRPC would use for the call, under the
// content-subtype gRPC would send, and leaves the options alone when it
// cannot tell the codec; the caller's slice is never written.
func TestWatchReplyWrapsTheCallsCodec(t *testing.T) {
	for _, tc := range []struct {
		name     string
		opts     []grpc.CallOption
		wrapped  bool
		wantName string
	}{
		{name: "default", wrapped: true, wantName: ""},
		{name: "content-subtype", opts: []grpc.CallOption{grpc.CallContentSubtype("proto")}, wrapped: true, wantName: "proto"},
		{name: "V2 codec", opts: []grpc.CallOption{grpc.ForceCodecV2(encoding.GetCodecV2("proto"))}, wrapped: true, wantName: "proto"},
		{name: "V1 codec", opts: []grpc.CallOption{grpc.ForceCodec(jsonCodec{})}, wrapped: true, wantName: "JSON"},
		//lint:ignore SA1019 the deprecated option is what this case holds the wrapper to leave alone
		{name: "deprecated codec", opts: []grpc.CallOption{grpc.CallCustomCodec(oldCodec{})}},
		{name: "no codec registered", opts: []grpc.CallOption{grpc.CallContentSubtype("nonesuch")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &retryState{}
			in := append(make([]grpc.CallOption, 0, len(tc.opts)+1), tc.opts...)
			got := st.watchReply(in)
			if !tc.wrapped {
				assert.Equal(t, in, got)
				return
			}
			require.Len(t, got, len(in)+1)
			assert.Nil(t, in[:cap(in)][len(in)], "the caller's slice written")
			req := &testgrpc.SimpleRequest{ResponseSize: 7}
			reply := &testgrpc.SimpleRequest{}
			switch o := got[len(got)-1].(type) {
			case grpc.ForceCodecV2CallOption:
				assert.Equal(t, tc.wantName, o.CodecV2.Name())
				data, err := o.CodecV2.Marshal(req)
				require.NoError(t, err)
				assert.True(t, st.asked.Load())
				assert.False(t, st.replied.Load())
				require.NoError(t, o.CodecV2.Unmarshal(data, reply))
				data.Free()
			case grpc.ForceCodecCallOption:
				assert.Equal(t, tc.wantName, o.Codec.Name())
				data, err := o.Codec.Marshal(req)
				require.NoError(t, err)
				assert.True(t, st.asked.Load())
				assert.False(t, st.replied.Load())
				require.NoError(t, o.Codec.Unmarshal(data, reply))
			default:
				t.Fatalf("last option %T", o)
			}
			assert.True(t, st.replied.Load())
			assert.EqualValues(t, 7, reply.ResponseSize, "decoded by the call's codec")
			assert.False(t, st.unanswered(), "a message came")
		})
	}
}
