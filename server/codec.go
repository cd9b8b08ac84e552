package server

import (
	"connectrpc.com/connect"

	"github.com/capledger/capledger/api/hotjson"
)

// jsonCodecs returns the handler options that install the strict JSON
// codec. Connect's own JSON codec discards unknown fields, so a misspelt
// field (say `actualUnit` for `actualUnits`) was silently ignored and a
// Settle recorded zero usage; this one refuses it, and protojson names
// the field in the error (`unknown field "actualUnit"`), which connect
// answers as invalid_argument. It writes and reads the hot messages
// without reflection (package hotjson). Registered under both names
// connect serves JSON as ("json" and "json; charset=utf-8"), it also
// decodes Connect GET requests' `message` parameter and gRPC-Web's +json.
func jsonCodecs() []connect.HandlerOption {
	return []connect.HandlerOption{
		connect.WithCodec(hotjson.Codec{CodecName: "json", Strict: true}),
		connect.WithCodec(hotjson.Codec{CodecName: "json; charset=utf-8", Strict: true}),
	}
}
