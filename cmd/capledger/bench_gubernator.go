package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
)

// gubernatorGRPCMethod is GetRateLimits of gubernator's service
// pb.gubernator.V1 (gubernator.proto of v2.13.0).
const gubernatorGRPCMethod = "/pb.gubernator.V1/GetRateLimits"

// rawCodec passes already-encoded protobuf through grpc-go: bench builds
// gubernator's two messages with protowire instead of importing
// gubernator's module (and its dependency tree) for two structs. Its name
// is "proto", so the calls carry the content type gubernator expects.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append((*v.(*[]byte))[:0], data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// appendGubernatorRequest encodes GetRateLimitsReq{requests: [RateLimitReq{
// name, unique_key, hits, limit, duration (ms)}]} (fields 1-5; algorithm
// and behavior stay TOKEN_BUCKET and BATCHING, their zero values).
func appendGubernatorRequest(b []byte, name, key string, hits, limit, durationMs int64) []byte {
	var item []byte
	item = protowire.AppendTag(item, 1, protowire.BytesType)
	item = protowire.AppendString(item, name)
	item = protowire.AppendTag(item, 2, protowire.BytesType)
	item = protowire.AppendString(item, key)
	item = protowire.AppendTag(item, 3, protowire.VarintType)
	item = protowire.AppendVarint(item, uint64(hits))
	item = protowire.AppendTag(item, 4, protowire.VarintType)
	item = protowire.AppendVarint(item, uint64(limit))
	item = protowire.AppendTag(item, 5, protowire.VarintType)
	item = protowire.AppendVarint(item, uint64(durationMs))
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	return protowire.AppendBytes(b, item)
}

// gubernatorAnswer is what bench reads of one RateLimitResp.
type gubernatorAnswer struct {
	overLimit bool   // status (field 1) OVER_LIMIT
	err       string // error (field 5)
}

// parseGubernatorResponse decodes GetRateLimitsResp's responses (field
// 1), reading status and error of each and skipping the other fields.
func parseGubernatorResponse(b []byte) ([]gubernatorAnswer, error) {
	var out []gubernatorAnswer
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		if num != 1 || typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return nil, protowire.ParseError(n)
			}
			b = b[n:]
			continue
		}
		item, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		var a gubernatorAnswer
		for len(item) > 0 {
			num, typ, n := protowire.ConsumeTag(item)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			item = item[n:]
			switch {
			case num == 1 && typ == protowire.VarintType:
				v, n := protowire.ConsumeVarint(item)
				if n < 0 {
					return nil, protowire.ParseError(n)
				}
				a.overLimit = v == 1
				item = item[n:]
			case num == 5 && typ == protowire.BytesType:
				s, n := protowire.ConsumeString(item)
				if n < 0 {
					return nil, protowire.ParseError(n)
				}
				a.err = s
				item = item[n:]
			default:
				if n = protowire.ConsumeFieldValue(num, typ, item); n < 0 {
					return nil, protowire.ParseError(n)
				}
				item = item[n:]
			}
		}
		out = append(out, a)
	}
	return out, nil
}

// gubernatorGRPCOp calls GetRateLimits over gubernator's gRPC API (its
// GUBER_GRPC_ADDRESS at --addr), one HTTP/2 connection as a grpc-go
// client keeps, with the request of gubernatorOp.
func gubernatorGRPCOp(cfg *benchConfig) (func(context.Context, *benchWorker) (int, error), error) {
	target := strings.TrimRight(strings.TrimPrefix(cfg.conn.addr, "http://"), "/")
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
	if err != nil {
		return nil, fmt.Errorf("gubernator: %w", err)
	}
	return func(ctx context.Context, w *benchWorker) (int, error) {
		req := appendGubernatorRequest(nil, cfg.route, w.subject(cfg), cfg.units, 1<<50, time.Hour.Milliseconds())
		var resp []byte
		if err := conn.Invoke(ctx, gubernatorGRPCMethod, &req, &resp); err != nil {
			return 0, err
		}
		answers, err := parseGubernatorResponse(resp)
		if err != nil {
			return 0, fmt.Errorf("gubernator: %w", err)
		}
		if len(answers) != 1 || answers[0].err != "" || answers[0].overLimit {
			return 0, fmt.Errorf("gubernator: unexpected answer %+v", answers)
		}
		return 1, nil
	}, nil
}
