package envoyrls_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	rlscommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// rawCodec sends a request's bytes as they are (no protobuf encoder
// writes a string that is not UTF-8, which Envoy's C++ may send from a
// header) and decodes answers as protobuf.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

// A descriptor value that is not UTF-8 is INVALID_ARGUMENT, nothing
// charged, whether grpc-go serves ShouldRateLimit directly or through the
// bridge: grpc-go's own decoding answered INTERNAL (a bug) directly.
func TestDescriptorNotUTF8IsInvalidArgument(t *testing.T) {
	for _, bridged := range []bool{false, true} {
		h := newHarness(t, options{config: testMapping(t), bridged: bridged})
		h.publish("acme", "search", "requests", 10, 1, time.Hour, false)
		req, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{descriptor(nil, "tenant", "acmeUTF8", "route", "search")}})
		if err != nil {
			t.Fatal(err)
		}
		req = bytes.Replace(req, []byte("acmeUTF8"), []byte("acme\xff\xfe\xfd\xfc"), 1)
		conn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+gatewayToken)
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = conn.Invoke(ctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, &req, new(rlsv3.RateLimitResponse), grpc.ForceCodecV2(rawCodec{}))
		cancel()
		conn.Close()
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("bridged %v: %v, want INVALID_ARGUMENT", bridged, err)
		}
		if resp := h.mustCheck(&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{descriptor(nil, "tenant", "acme", "route", "search")}}); resp.GetStatuses()[0].GetLimitRemaining() != 9 {
			t.Errorf("bridged %v: the first valid check after it: %v", bridged, resp)
		}
	}
}
