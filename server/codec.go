package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// strictJSONCodec is connect's JSON codec except that it refuses unknown
// fields: connect's own discards them, so a misspelt field (say
// `actualUnit` for `actualUnits`) was silently ignored and a Settle
// recorded zero usage. protojson names the field in its error
// (`unknown field "actualUnit"`), which connect answers as
// invalid_argument. Registered under both names connect serves JSON as
// ("json" and "json; charset=utf-8"), it also decodes Connect GET
// requests' `message` parameter and gRPC-Web's +json.
type strictJSONCodec struct{ name string }

// jsonCodecs returns the handler options that install the strict codec.
func jsonCodecs() []connect.HandlerOption {
	return []connect.HandlerOption{
		connect.WithCodec(strictJSONCodec{name: "json"}),
		connect.WithCodec(strictJSONCodec{name: "json; charset=utf-8"}),
	}
}

func (c strictJSONCodec) Name() string { return c.name }

func (c strictJSONCodec) Marshal(message any) ([]byte, error) {
	m, ok := message.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a protobuf message", message)
	}
	return protojson.MarshalOptions{}.Marshal(m)
}

func (c strictJSONCodec) Unmarshal(data []byte, message any) error {
	m, ok := message.(proto.Message)
	if !ok {
		return fmt.Errorf("%T is not a protobuf message", message)
	}
	if len(data) == 0 {
		return errors.New("zero-length payload is not a valid JSON object")
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(data, m); err != nil {
		return fmt.Errorf("request body: %w", err)
	}
	return nil
}

// MarshalStable and IsBinary make the codec usable for Connect GET
// requests, as connect's own JSON codec is.
func (c strictJSONCodec) MarshalStable(message any) ([]byte, error) {
	raw, err := c.Marshal(message)
	if err != nil {
		return nil, err
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return nil, err
	}
	return compact.Bytes(), nil
}

func (c strictJSONCodec) IsBinary() bool { return false }
