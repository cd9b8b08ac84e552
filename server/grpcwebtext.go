package server

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"connectrpc.com/connect"
)

// grpcWebTextType is the content type of gRPC-Web's text mode: the frames
// of binary gRPC-Web, base64-encoded both ways. It is the grpc-web
// JavaScript client's default (mode "grpcwebtext") and that client's only
// mode for server streaming, so "any gRPC-Web client" includes it.
// connect-go serves binary gRPC-Web only.
const grpcWebTextType = "application/grpc-web-text"

// grpcWebBinaryType is the binary gRPC-Web content type connect-go serves;
// text mode is translated to it (a codec suffix kept).
const grpcWebBinaryType = "application/grpc-web"

// grpcWebText serves gRPC-Web's text mode by translating it to binary
// gRPC-Web around next: the request body is decoded and its content type
// rewritten (application/grpc-web-text[+codec] to
// application/grpc-web[+codec]) before next sees it, so the body limit,
// auth and every handler are the binary path's; the answer is re-encoded
// and labelled as text. Every other request passes through untouched.
// maxWire bounds the base64 body read.
func grpcWebText(next http.Handler, maxWire int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		contentType := r.Header.Get("Content-Type")
		if !strings.HasPrefix(contentType, grpcWebTextType) {
			next.ServeHTTP(acceptPostWriter{w}, r)
			return
		}
		binaryType := grpcWebBinaryType + strings.TrimPrefix(contentType, grpcWebTextType)
		if r.Body != nil && r.Body != http.NoBody {
			wire, err := io.ReadAll(io.LimitReader(r.Body, maxWire+1))
			r.Body.Close()
			if err == nil && int64(len(wire)) > maxWire {
				err = fmt.Errorf("request body is larger than %d bytes of base64", maxWire)
				grpcWebTextError(w, contentType, connect.CodeResourceExhausted, err)
				return
			}
			var body []byte
			if err == nil {
				body, err = decodeBase64Chunks(wire)
			}
			if err != nil {
				grpcWebTextError(w, contentType, connect.CodeInvalidArgument, fmt.Errorf("grpc-web-text body: %w", err))
				return
			}
			r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
			r.Header.Del("Content-Length")
		}
		r.Header.Set("Content-Type", binaryType)
		if accept := r.Header.Get("Accept"); strings.HasPrefix(accept, grpcWebTextType) {
			r.Header.Set("Accept", grpcWebBinaryType+strings.TrimPrefix(accept, grpcWebTextType))
		}
		tw := &grpcWebTextWriter{ResponseWriter: w}
		defer tw.finish()
		next.ServeHTTP(tw, r)
	})
}

// acceptPostWriter adds the text-mode content types to the Accept-Post
// header of a 415 answer: connect-go lists the types it serves, binary
// gRPC-Web among them, and this handler serves the text form of each of
// those, so the list a client reads after a wrong Content-Type is what
// the port accepts, derived from connect-go's own.
type acceptPostWriter struct{ http.ResponseWriter }

func (w acceptPostWriter) WriteHeader(status int) {
	listTextTypes(w.Header(), status)
	w.ResponseWriter.WriteHeader(status)
}

// Flush and Unwrap keep streaming answers and http.ResponseController
// working through the wrapper.
func (w acceptPostWriter) Flush() { http.NewResponseController(w.ResponseWriter).Flush() }

func (w acceptPostWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// listTextTypes adds the text-mode types to h's Accept-Post when status
// is 415 (connect-go's answer to a Content-Type it does not serve).
func listTextTypes(h http.Header, status int) {
	if status != http.StatusUnsupportedMediaType {
		return
	}
	if list := h.Get("Accept-Post"); list != "" {
		h.Set("Accept-Post", withGrpcWebTextVariants(list))
	}
}

// withGrpcWebTextVariants returns acceptPost (a comma-separated list of
// content types) with the text-mode type of every binary gRPC-Web type in
// it (application/grpc-web+proto: application/grpc-web-text+proto), sorted
// as connect-go sorts its list.
func withGrpcWebTextVariants(acceptPost string) string {
	types := strings.Split(acceptPost, ", ")
	for _, t := range types {
		if codec, ok := strings.CutPrefix(t, grpcWebBinaryType); ok && !strings.HasPrefix(t, grpcWebTextType) {
			types = append(types, grpcWebTextType+codec)
		}
	}
	slices.Sort(types)
	return strings.Join(slices.Compact(types), ", ")
}

// grpcWebTextError answers a text-mode request that never reached a
// handler, trailers-only as a gRPC-Web error before any message is.
func grpcWebTextError(w http.ResponseWriter, contentType string, code connect.Code, err error) {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Grpc-Status", strconv.Itoa(int(code)))
	w.Header().Set("Grpc-Message", err.Error())
	w.WriteHeader(http.StatusOK)
}

// decodeBase64Chunks decodes standard base64 that may be several padded
// chunks one after another (a streaming gRPC-Web text body is allowed to be
// encoded chunk by chunk), ignoring line ends.
func decodeBase64Chunks(wire []byte) ([]byte, error) {
	wire = bytes.Map(func(r rune) rune {
		if r == '\r' || r == '\n' {
			return -1
		}
		return r
	}, wire)
	var out []byte
	for len(wire) > 0 {
		end := len(wire)
		if pad := bytes.IndexByte(wire, '='); pad >= 0 {
			end = (pad/4 + 1) * 4 // the end of the quantum the padding closes
		}
		if end > len(wire) {
			return nil, errors.New("base64: truncated chunk")
		}
		chunk := make([]byte, base64.StdEncoding.DecodedLen(end))
		n, err := base64.StdEncoding.Decode(chunk, wire[:end])
		if err != nil {
			return nil, fmt.Errorf("base64: %w", err)
		}
		out = append(out, chunk[:n]...)
		wire = wire[end:]
	}
	return out, nil
}

// grpcWebTextWriter re-encodes binary gRPC-Web as text: whole 3-byte groups
// go out as they are written, the rest waits for more or for a flush, so
// the answer is one base64 stream padded only where it was flushed (each
// message of a server stream, and the trailers).
type grpcWebTextWriter struct {
	http.ResponseWriter
	pending     []byte
	wroteHeader bool
}

func (w *grpcWebTextWriter) WriteHeader(status int) {
	if w.wroteHeader {
		return
	}
	w.wroteHeader = true
	h := w.Header()
	if ct := h.Get("Content-Type"); strings.HasPrefix(ct, grpcWebBinaryType) {
		h.Set("Content-Type", grpcWebTextType+strings.TrimPrefix(ct, grpcWebBinaryType))
	}
	h.Del("Content-Length") // counts binary bytes
	listTextTypes(h, status)
	w.ResponseWriter.WriteHeader(status)
}

func (w *grpcWebTextWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	w.pending = append(w.pending, p...)
	whole := len(w.pending) / 3 * 3
	if whole > 0 {
		if _, err := w.ResponseWriter.Write([]byte(base64.StdEncoding.EncodeToString(w.pending[:whole]))); err != nil {
			return 0, err
		}
		w.pending = append(w.pending[:0], w.pending[whole:]...)
	}
	return len(p), nil
}

// Flush sends what is pending, padded, then flushes the connection. The
// header goes through WriteHeader first: a trailers-only answer (an error
// before any message) is headers and a flush, and flushing the underlying
// writer directly would send them unlabelled, application/grpc-web.
func (w *grpcWebTextWriter) Flush() {
	w.WriteHeader(http.StatusOK)
	w.writePending()
	http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *grpcWebTextWriter) writePending() {
	if len(w.pending) > 0 {
		w.ResponseWriter.Write([]byte(base64.StdEncoding.EncodeToString(w.pending)))
		w.pending = w.pending[:0]
	}
}

// finish sends the last bytes once the handler returned, and labels an
// answer the handler wrote nothing of (net/http would send its header as
// it is).
func (w *grpcWebTextWriter) finish() {
	w.WriteHeader(http.StatusOK)
	w.writePending()
}

// Unwrap lets http.ResponseController reach the connection's own writer.
func (w *grpcWebTextWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
