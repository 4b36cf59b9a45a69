package grpcbalancer

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
)

// watchReply returns the call options of a unary call of st's with the
// call's codec wrapped, so that st learns whether the call's request was
// encoded with it (asked) and whether a response message arrived (replied;
// see retryState.unanswered): grpc-go counts a unary call's response
// headers as bytes received (balancer.DoneInfo.BytesReceived), and a server
// may send them before it has an answer (grpc.SendHeader, or headers it
// flushes early), also when its engine hangs. The codec is the one gRPC
// would use (the last grpc.ForceCodec or ForceCodecV2 among opts, else
// the one registered for the last grpc.CallContentSubtype, else proto's,
// a V1 codec first as gRPC looks them up), and the wrapper names the same
// content-subtype, so nothing on the wire changes. opts is returned as it
// is when the codec cannot be told (a deprecated grpc.CallCustomCodec, a
// content-subtype with no codec registered, which gRPC fails itself).
func (st *retryState) watchReply(opts []grpc.CallOption) []grpc.CallOption {
	var v1 encoding.Codec
	var v2 encoding.CodecV2
	subtype := ""
	for _, o := range opts {
		switch o := o.(type) {
		case grpc.ForceCodecCallOption:
			v1, v2 = o.Codec, nil
		case grpc.ForceCodecV2CallOption:
			v1, v2 = nil, o.CodecV2
		case grpc.CustomCodecCallOption:
			return opts
		case grpc.ContentSubtypeCallOption:
			subtype = o.ContentSubtype
		}
	}
	if v1 == nil && v2 == nil {
		name := subtype
		if name == "" {
			name = "proto" // gRPC's default; the content-subtype stays unset
		}
		if v1 = encoding.GetCodec(name); v1 == nil {
			if v2 = encoding.GetCodecV2(name); v2 == nil {
				return opts
			}
		}
		// A codec gRPC looked up names no content-subtype of its own: an
		// unset one stays unset ("application/grpc").
		st.codec = replyCodec{st: st, name: subtype, v1: v1, v2: v2}
	} else {
		name := ""
		if v1 != nil {
			name = v1.Name()
		} else {
			name = v2.Name()
		}
		st.codec = replyCodec{st: st, name: name, v1: v1, v2: v2}
	}
	opts = opts[:len(opts):len(opts)] // the caller's slice stays as it was
	if v1 != nil {
		return append(opts, grpc.ForceCodec(replyCodecV1{&st.codec}))
	}
	return append(opts, grpc.ForceCodecV2(&st.codec))
}

// replyCodec is a unary call's codec, v2 (or v1, see replyCodecV1),
// wrapped to tell its retryState whether the request was encoded with it
// and whether a response message arrived (see watchReply).
type replyCodec struct {
	st   *retryState
	name string
	v1   encoding.Codec
	v2   encoding.CodecV2
}

func (c *replyCodec) Marshal(v any) (mem.BufferSlice, error) {
	c.st.asked.Store(true)
	return c.v2.Marshal(v)
}

// Unmarshal marks the answer as arrived before it decodes it: a message
// that fails to decode came from the server all the same.
func (c *replyCodec) Unmarshal(data mem.BufferSlice, v any) error {
	c.st.replied.Store(true)
	return c.v2.Unmarshal(data, v)
}

func (c *replyCodec) Name() string { return c.name }

// replyCodecV1 is replyCodec around a V1 codec (encoding.Codec), which
// gRPC adapts itself (grpc.ForceCodec).
type replyCodecV1 struct{ c *replyCodec }

func (c replyCodecV1) Marshal(v any) ([]byte, error) {
	c.c.st.asked.Store(true)
	return c.c.v1.Marshal(v)
}

func (c replyCodecV1) Unmarshal(data []byte, v any) error {
	c.c.st.replied.Store(true)
	return c.c.v1.Unmarshal(data, v)
}

func (c replyCodecV1) Name() string { return c.c.name }
