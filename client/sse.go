package client

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// StreamUsage is the usage object an OpenAI-style stream sends in its
// final event (`data: {..., "usage": {"prompt_tokens": 9,
// "completion_tokens": 12, "total_tokens": 21}}`, then `data: [DONE]`).
type StreamUsage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

// maxSSELine bounds the line an SSEUsageScanner buffers. A longer line is
// not held: a data line that names "usage" makes the stream's usage
// unknown (it cannot be read); any other is skipped.
const maxSSELine = 1 << 20

// usageName is what a data line must contain to be read as a usage event.
var usageName = []byte(`"usage"`)

// SSEUsageScanner is an io.Writer that reads a server-sent-events stream
// as it passes (tee the response into it) and keeps the usage object of
// the last `data:` event that carries one. It holds at most one line in
// memory. A usage event it cannot read (malformed JSON, a count that is
// not an integer) replaces whatever came before it: the stream's last
// usage is then unknown (Usage reports none, Err says why), never the
// earlier, partial figure. So does a `data:` line over 1 MiB that
// names "usage" (it is not held, so it cannot be read); an over-long line
// without it is skipped.
//
// Usage, Err and Done answer for a stream that ends at the last byte
// written, so call them once it has: no other end-of-stream call is
// needed. A last line without a line end (the upstream closed right
// after it) is read then: as any other line when it is whole JSON (or
// `[DONE]`); when it is not (cut mid-line, or over 1 MiB and not held)
// it may be the usage event, cut, so the usage is unknown. They leave
// that line held: bytes written later continue it. The middleware runs
// one over every text/event-stream response (UsageInfo.Stream); a
// handler of its own can use one with io.MultiWriter.
type SSEUsageScanner struct {
	line    []byte
	skip    bool // the current line is over maxSSELine: not held
	usage   *StreamUsage
	done    bool
	invalid error
	// Of a skipped line: whether it is a data line, whether it names
	// "usage", and its last len(usageName)-1 bytes (a name split
	// between two writes).
	longData, longUsage bool
	tail                []byte
}

// NewSSEUsageScanner returns an empty scanner.
func NewSSEUsageScanner() *SSEUsageScanner { return &SSEUsageScanner{} }

// Write consumes stream bytes; it never fails.
func (s *SSEUsageScanner) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			s.appendLine(p)
			break
		}
		s.appendLine(p[:i])
		if !s.skip {
			s.apply(readLine(bytes.TrimRight(s.line, "\r"), false))
		} else if s.longData && s.longUsage {
			// It may be the last usage event: an earlier one is no
			// longer the stream's final figure.
			s.apply(lineRead{unreadable: fmt.Errorf("unreadable usage event: a data line over %d bytes was not read", maxSSELine)})
		}
		s.line, s.skip = s.line[:0], false
		p = p[i+1:]
	}
	return n, nil
}

func (s *SSEUsageScanner) appendLine(p []byte) {
	if s.skip {
		s.scanLong(p)
		return
	}
	if len(s.line)+len(p) > maxSSELine {
		// Too long to hold: note whether it is a data line naming
		// "usage" instead, and drop what is held.
		var head [len("data:")]byte
		n := copy(head[:], s.line)
		n += copy(head[n:], p)
		s.skip, s.longData, s.longUsage, s.tail = true, bytes.HasPrefix(head[:n], []byte("data:")), false, s.tail[:0]
		s.scanLong(s.line)
		s.scanLong(p)
		s.line = s.line[:0]
		return
	}
	s.line = append(s.line, p...)
}

// scanLong looks for "usage" in the next bytes p of a skipped data line.
func (s *SSEUsageScanner) scanLong(p []byte) {
	if !s.longData || s.longUsage || len(p) == 0 {
		return
	}
	k := len(usageName) - 1
	// A name split between the held tail and p.
	var across [2 * len(`"usage"`)]byte
	joined := append(append(across[:0], s.tail...), p[:min(len(p), k)]...)
	if bytes.Contains(joined, usageName) || bytes.Contains(p, usageName) {
		s.longUsage = true
		return
	}
	if len(p) >= k {
		s.tail = append(s.tail[:0], p[len(p)-k:]...)
	} else {
		s.tail = append(s.tail[:0], joined[max(0, len(joined)-k):]...)
	}
}

// lineRead is what one line tells of the stream's usage.
type lineRead struct {
	done       bool         // `data: [DONE]`
	usage      *StreamUsage // a readable usage event
	unreadable error        // a usage event that cannot be read (or may be one)
}

// readLine reads one line; cut says the stream ended inside it (no line
// end followed).
func readLine(line []byte, cut bool) lineRead {
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return lineRead{}
	}
	data = bytes.TrimSpace(data)
	if string(data) == "[DONE]" {
		return lineRead{done: true}
	}
	if !bytes.Contains(data, usageName) {
		if cut && !json.Valid(data) {
			// Cut before its name, it may still be the usage event.
			return lineRead{unreadable: errors.New("unreadable usage event: the stream ended inside a data line that is not whole JSON")}
		}
		return lineRead{}
	}
	var ev struct {
		Usage *StreamUsage `json:"usage"`
	}
	if err := json.Unmarshal(data, &ev); err != nil {
		if cut {
			return lineRead{unreadable: fmt.Errorf("unreadable usage event: the stream ended inside it: %w", err)}
		}
		return lineRead{unreadable: fmt.Errorf("unreadable usage event: %w", err)}
	}
	return lineRead{usage: ev.Usage}
}

// apply takes what a line told into the scanner's state.
func (s *SSEUsageScanner) apply(r lineRead) {
	s.done = s.done || r.done
	switch {
	case r.unreadable != nil:
		// The last usage event counts: an earlier one is no longer the
		// stream's final figure (settling it would undercharge).
		s.usage, s.invalid = nil, r.unreadable
	case r.usage != nil: // a "usage": null does not erase the last one
		s.usage, s.invalid = r.usage, nil
	}
}

// atEnd returns the scanner's state for a stream that ends here: with the
// line it holds (no line end came yet) read as the last. s is left as it
// is, so a later Write continues that line.
func (s *SSEUsageScanner) atEnd() SSEUsageScanner {
	end := SSEUsageScanner{usage: s.usage, done: s.done, invalid: s.invalid}
	switch {
	case s.skip && s.longData:
		// Not held, so not readable; its end never came, so it may have
		// named "usage" after what was seen.
		end.apply(lineRead{unreadable: fmt.Errorf("unreadable usage event: the stream ended inside a data line over %d bytes, which was not read", maxSSELine)})
	case !s.skip && len(s.line) > 0:
		end.apply(readLine(bytes.TrimRight(s.line, "\r"), true))
	}
	return end
}

// Usage returns the usage of the last event that carried one, and
// whether there was one, for a stream that ends here.
func (s *SSEUsageScanner) Usage() (StreamUsage, bool) {
	end := s.atEnd()
	if end.usage == nil {
		return StreamUsage{}, false
	}
	return *end.usage, true
}

// Err returns why the last usage event of a stream ending here could not
// be read, nil when it could (or none came). Usage reports no usage then.
func (s *SSEUsageScanner) Err() error { return s.atEnd().invalid }

// Done reports whether the stream's `data: [DONE]` terminator was seen.
func (s *SSEUsageScanner) Done() bool { return s.atEnd().done }

// UsageFromStream returns a UsageReader for streamed (text/event-stream)
// answers: the usage the handler passed to ReportUsage if any, else the
// usage object of the stream's final event, mapped to units by
// fieldByUnit (unit -> "prompt_tokens", "completion_tokens" or
// "total_tokens", e.g. {"tokens": "total_tokens"}); extra fixes units
// that are not in the stream (e.g. {"requests": 1}). A stream that ended
// without a usage object (the backend died, the client went away before
// the end) or whose last usage event cannot be read (SSEUsageScanner.Err,
// in the error's text; a last line cut mid-line included) gives
// ErrUsageUnknown: the capacity stays held,
// never refunded, and never settled at an earlier event's figure.
func UsageFromStream(fieldByUnit map[string]string, extra Units) UsageReader {
	return func(u *UsageInfo) (Units, error) {
		if u.Reported != nil {
			return u.Reported, nil
		}
		usage, ok := StreamUsage{}, false
		if u.Stream != nil {
			usage, ok = u.Stream.Usage()
		}
		if !ok {
			if u.Stream != nil && u.Stream.Err() != nil {
				return nil, fmt.Errorf("stream's last usage event (status %d): %v: %w", u.Status, u.Stream.Err(), ErrUsageUnknown)
			}
			return nil, fmt.Errorf("stream ended without a usage event (status %d): %w", u.Status, ErrUsageUnknown)
		}
		actual := make(Units, len(fieldByUnit)+len(extra))
		for unit, v := range extra {
			actual[unit] = v
		}
		for unit, field := range fieldByUnit {
			switch strings.ToLower(field) {
			case "prompt_tokens":
				actual[unit] = usage.PromptTokens
			case "completion_tokens":
				actual[unit] = usage.CompletionTokens
			case "total_tokens":
				actual[unit] = usage.TotalTokens
			default:
				return nil, fmt.Errorf("usage field %q: want prompt_tokens, completion_tokens or total_tokens: %w", field, ErrUsageUnknown)
			}
			if actual[unit] < 0 {
				return nil, fmt.Errorf("usage %s = %d: %w", field, actual[unit], ErrUsageUnknown)
			}
		}
		return actual, nil
	}
}
