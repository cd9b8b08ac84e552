package hotjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Codec is a connect codec for JSON: the hot messages by hand, every
// other message (and every input off the fast path) by protojson.
// Strict refuses unknown fields (the server: a misspelt field must not
// pass for an absent one); without it they are discarded (a client
// reading answers of a newer server), as connect's own JSON codec does.
type Codec struct {
	// CodecName is the name connect registers it under ("json", or
	// "json; charset=utf-8").
	CodecName string
	Strict    bool
}

func (c Codec) Name() string { return c.CodecName }

func (c Codec) Marshal(message any) ([]byte, error) {
	return c.MarshalAppend(nil, message)
}

// MarshalAppend appends to a buffer connect reuses between calls.
func (c Codec) MarshalAppend(dst []byte, message any) ([]byte, error) {
	m, ok := message.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a protobuf message", message)
	}
	if out, ok := Append(dst, m); ok {
		return out, nil
	}
	return protojson.MarshalOptions{}.MarshalAppend(dst, m)
}

func (c Codec) Unmarshal(data []byte, message any) error {
	m, ok := message.(proto.Message)
	if !ok {
		return fmt.Errorf("%T is not a protobuf message", message)
	}
	if len(data) == 0 {
		return errors.New("zero-length payload is not a valid JSON object")
	}
	if Decode(data, m) {
		return nil
	}
	err := (protojson.UnmarshalOptions{DiscardUnknown: !c.Strict}).Unmarshal(data, m)
	if err != nil && c.Strict {
		return fmt.Errorf("request body: %w", err)
	}
	return err
}

// MarshalStable and IsBinary make the codec usable for Connect GET
// requests, as connect's own JSON codec is.
func (c Codec) MarshalStable(message any) ([]byte, error) {
	m, ok := message.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a protobuf message", message)
	}
	raw, err := protojson.MarshalOptions{}.Marshal(m)
	if err != nil {
		return nil, err
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return nil, err
	}
	return compact.Bytes(), nil
}

func (c Codec) IsBinary() bool { return false }
