package client

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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

// statedUsage is a usage object as an event states it: a count that is
// absent (or null) is not stated, which is not the same as 0.
type statedUsage struct {
	PromptTokens     *int64 `json:"prompt_tokens"`
	CompletionTokens *int64 `json:"completion_tokens"`
	TotalTokens      *int64 `json:"total_tokens"`
}

// count returns the count named field ("prompt_tokens",
// "completion_tokens" or "total_tokens", any case), whether it is one of
// those names, and whether the event stated it.
func (u *statedUsage) count(field string) (value int64, known, stated bool) {
	var p *int64
	switch strings.ToLower(field) {
	case "prompt_tokens":
		p = u.PromptTokens
	case "completion_tokens":
		p = u.CompletionTokens
	case "total_tokens":
		p = u.TotalTokens
	default:
		return 0, false, false
	}
	if p == nil {
		return 0, true, false
	}
	return *p, true, true
}

func (u *statedUsage) values() StreamUsage {
	var out StreamUsage
	out.PromptTokens, _, _ = u.count("prompt_tokens")
	out.CompletionTokens, _, _ = u.count("completion_tokens")
	out.TotalTokens, _, _ = u.count("total_tokens")
	return out
}

// maxSSELine bounds what an SSEUsageScanner holds: the data of the event
// being read and the line being read, together. An event whose data does
// not fit is not held: when its data names "usage" the stream's usage
// becomes unknown (it cannot be read); any other is skipped. A line that
// does not fit and is not a data line is skipped.
const maxSSELine = 1 << 20

// usageName is what an event's data must contain to be read as a usage
// event.
var usageName = []byte(`"usage"`)

// SSEUsageScanner is an io.Writer that reads a server-sent-events stream
// as it passes (tee the response into it) and keeps the usage object of
// the last event that carries one. It reads the stream as the SSE
// specification (WHATWG HTML, "event stream interpretation") does: a
// byte order mark at the start is ignored; lines end in CRLF, LF or a
// bare CR; an event's data is its `data:` lines
// joined by "\n" (so a JSON object split over several data lines is read
// whole); comments and other fields are ignored; and an event is read
// only at the blank line that ends it. It holds at most 1 MiB: the data
// of the event being read and the current line. A usage event it cannot
// read (malformed JSON, a count that is not an integer, data over 1 MiB
// that names "usage") replaces whatever came before it: the stream's last
// usage is then unknown (Usage reports none, Err says why), never the
// earlier, partial figure. An over-long event without it is skipped.
//
// Usage, Err and Done answer for a stream that ends at the last byte
// written, so call them once it has: no other end-of-stream call is
// needed. The specification drops an event the stream ends inside (no
// blank line after it); it may be the final usage event, cut, so the
// scanner does not just drop it. Such a last event (a last line without
// a line end included) is read as if its blank line had come when its
// data is whole JSON (or `[DONE]`): more data lines could only have made
// it unreadable, never another figure. When it is not whole (cut inside a
// line, between the data lines of an object split over several, inside
// the field name `data`, or over 1 MiB and not held) it may be the usage
// event, cut, so the usage is unknown. They leave that event held: bytes
// written later continue it. The middleware runs one over every
// text/event-stream response (UsageInfo.Stream); a handler of its own can
// use one with io.MultiWriter.
type SSEUsageScanner struct {
	line    []byte    // the line being read, while it is held
	lineIs  lineState // whether it is held, or why not
	afterCR bool      // the last byte was a CR: an LF right after it ends no line
	// started: a byte other than a leading byte order mark was written.
	// The specification ignores one U+FEFF at the start of the stream
	// (bom holds the part of it written so far).
	started bool
	bom     []byte
	data    []byte // the event's data lines so far, each followed by "\n"
	hasData bool   // the event has a data line
	// The event's data did not fit (it is not held): whether it names
	// "usage", and the last len(usageName)-1 bytes of the data line being
	// scanned (a name split between two writes).
	long, longUsage bool
	tail            []byte
	usage           *statedUsage
	done            bool
	invalid         error
}

// lineState says whether the current line is held.
type lineState uint8

const (
	lineHeld     lineState = iota
	lineLongData           // a data line that did not fit: scanned for "usage", not held
	lineSkipped            // another line that did not fit: ignored
)

// NewSSEUsageScanner returns an empty scanner.
func NewSSEUsageScanner() *SSEUsageScanner { return &SSEUsageScanner{} }

// Write consumes stream bytes; it never fails.
func (s *SSEUsageScanner) Write(p []byte) (int, error) {
	n := len(p)
	if !s.started {
		p = s.skipBOM(p)
	}
	for len(p) > 0 {
		if s.afterCR {
			s.afterCR = false
			if p[0] == '\n' { // the LF of a CRLF
				p = p[1:]
				continue
			}
		}
		i := bytes.IndexAny(p, "\r\n")
		if i < 0 {
			s.appendLine(p)
			break
		}
		s.appendLine(p[:i])
		s.endLine()
		s.afterCR = p[i] == '\r'
		p = p[i+1:]
	}
	return n, nil
}

// utf8BOM is U+FEFF in UTF-8.
const utf8BOM = "\xEF\xBB\xBF"

// skipBOM drops a byte order mark at the start of the stream, also one
// split between writes, and returns the rest of p to read.
func (s *SSEUsageScanner) skipBOM(p []byte) []byte {
	for len(p) > 0 && len(s.bom) < len(utf8BOM) {
		if p[0] != utf8BOM[len(s.bom)] {
			// Not a byte order mark: what was held of it is stream.
			s.started = true
			held := s.bom
			s.bom = nil
			if len(held) > 0 {
				s.Write(held)
			}
			return p
		}
		s.bom = append(s.bom, p[0])
		p = p[1:]
	}
	if len(s.bom) == len(utf8BOM) {
		s.started, s.bom = true, nil
	}
	return p
}

func (s *SSEUsageScanner) appendLine(p []byte) {
	switch s.lineIs {
	case lineLongData:
		s.scanLong(p)
		return
	case lineSkipped:
		return
	}
	// A line is held until it is known whether it is a data line, so
	// that a long one can be told apart.
	if len(s.data)+len(s.line)+len(p) <= maxSSELine || len(s.line)+len(p) < len("data:") {
		s.line = append(s.line, p...)
		return
	}
	// Too long to hold. A data line makes the event long; any other is
	// skipped.
	var head [len("data:")]byte
	n := copy(head[:], s.line)
	n += copy(head[n:], p)
	if bytes.Equal(head[:n], []byte("data:")) {
		s.lineIs = lineLongData
		s.goLong()
		s.scanLong(s.line[min(len(s.line), len("data:")):])
		s.scanLong(p)
	} else {
		s.lineIs = lineSkipped
	}
	s.line = s.line[:0]
}

// goLong stops holding the event's data, noting whether what was held
// names "usage".
func (s *SSEUsageScanner) goLong() {
	s.hasData = true
	if !s.long {
		s.long, s.longUsage = true, bytes.Contains(s.data, usageName)
		s.data = s.data[:0]
	}
	s.tail = s.tail[:0]
}

// scanLong looks for "usage" in the next bytes p of a data line of a long
// event.
func (s *SSEUsageScanner) scanLong(p []byte) {
	if s.longUsage || len(p) == 0 {
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

// endLine takes the line just ended: a blank line dispatches the event, a
// data line adds to its data, any other field or a comment is ignored.
func (s *SSEUsageScanner) endLine() {
	line, state := s.line, s.lineIs
	s.line, s.lineIs = s.line[:0], lineHeld
	switch {
	case state != lineHeld: // a long data line was scanned as it came
	case len(line) == 0:
		s.apply(s.event(false))
		s.data, s.hasData, s.long, s.longUsage = s.data[:0], false, false, false
	default:
		if value, ok := dataValue(line); ok {
			s.addData(value)
		}
	}
}

// dataValue returns the value of a data line (one space after the colon
// dropped, as the specification says), and false for any other line.
func dataValue(line []byte) ([]byte, bool) {
	if string(line) == "data" {
		return nil, true
	}
	value, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return nil, false
	}
	value, _ = bytes.CutPrefix(value, []byte(" "))
	return value, true
}

func (s *SSEUsageScanner) addData(value []byte) {
	s.hasData = true
	if s.long {
		s.tail = s.tail[:0]
		s.scanLong(value)
		return
	}
	s.data = append(append(s.data, value...), '\n')
}

// event reads the event held, as its blank line dispatches it (cut false),
// or as the stream ends inside it (cut true).
func (s *SSEUsageScanner) event(cut bool) lineRead {
	switch {
	case !s.hasData:
		return lineRead{}
	case s.long && s.longUsage:
		return lineRead{unreadable: fmt.Errorf("unreadable usage event: its data over %d bytes was not read", maxSSELine)}
	case s.long && cut:
		// Not held, so not readable; its end never came, so it may have
		// named "usage" after what was seen.
		return lineRead{unreadable: fmt.Errorf("unreadable usage event: the stream ended inside an event over %d bytes, which was not read", maxSSELine)}
	case s.long:
		return lineRead{}
	}
	return readData(bytes.TrimSuffix(s.data, []byte("\n")), cut)
}

// lineRead is what one event tells of the stream's usage.
type lineRead struct {
	done       bool         // `data: [DONE]`
	usage      *statedUsage // a readable usage event
	unreadable error        // a usage event that cannot be read (or may be one)
}

// readData reads one event's data; cut says the stream ended inside the
// event (no blank line followed).
func readData(data []byte, cut bool) lineRead {
	data = bytes.TrimSpace(data)
	if string(data) == "[DONE]" {
		return lineRead{done: true}
	}
	if !bytes.Contains(data, usageName) {
		if cut && !json.Valid(data) {
			// Cut before its name, it may still be the usage event.
			return lineRead{unreadable: errors.New("unreadable usage event: the stream ended inside an event whose data is not whole JSON")}
		}
		return lineRead{}
	}
	var ev struct {
		Usage *statedUsage `json:"usage"`
	}
	if err := json.Unmarshal(data, &ev); err != nil {
		if cut {
			return lineRead{unreadable: fmt.Errorf("unreadable usage event: the stream ended inside it: %w", err)}
		}
		return lineRead{unreadable: fmt.Errorf("unreadable usage event: %w", err)}
	}
	return lineRead{usage: ev.Usage}
}

// apply takes what an event told into the scanner's state.
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

// atEnd returns the scanner's state for a stream that ends here: the
// event it holds (no blank line came yet), with the line it holds (no
// line end came yet), read as the last. s is left as it is, so a later
// Write continues that event.
func (s *SSEUsageScanner) atEnd() SSEUsageScanner {
	end := SSEUsageScanner{usage: s.usage, done: s.done, invalid: s.invalid,
		hasData: s.hasData, long: s.long, longUsage: s.longUsage, data: s.data}
	switch s.lineIs {
	case lineLongData:
		end.hasData, end.long = true, true
	case lineHeld:
		if value, ok := dataValue(s.line); ok {
			// The data and the held line are not written to: add the
			// line on a copy.
			end.hasData = true
			if !end.long {
				end.data = append(slices.Clip(end.data), value...)
			}
		} else if len(s.line) < len("data") && bytes.HasPrefix([]byte("data"), s.line) && len(s.line) > 0 {
			// Cut inside the field name: it may have been a data line.
			end.apply(lineRead{unreadable: errors.New("unreadable usage event: the stream ended inside a line that may be a data line")})
			return end
		}
	}
	end.apply(end.event(true))
	return end
}

// Usage returns the usage of the last event that carried one, and
// whether there was one, for a stream that ends here.
// A count the event left out (or sent as null) reads as 0 here;
// UsageFromStream refuses to settle a count that was not stated.
func (s *SSEUsageScanner) Usage() (StreamUsage, bool) {
	end := s.atEnd()
	if end.usage == nil {
		return StreamUsage{}, false
	}
	return end.usage.values(), true
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
// the end), whose last usage event cannot be read (SSEUsageScanner.Err,
// in the error's text; a last line cut mid-line included) or does not
// state (absent or null) a count of fieldByUnit gives
// ErrUsageUnknown: the capacity stays held,
// never refunded, and never settled at an earlier event's figure.
func UsageFromStream(fieldByUnit map[string]string, extra Units) UsageReader {
	return func(u *UsageInfo) (Units, error) {
		if u.Reported != nil {
			return u.Reported, nil
		}
		var usage *statedUsage
		if u.Stream != nil {
			usage = u.Stream.atEnd().usage
		}
		if usage == nil {
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
			value, known, stated := usage.count(field)
			switch {
			case !known:
				return nil, fmt.Errorf("usage field %q: want prompt_tokens, completion_tokens or total_tokens: %w", field, ErrUsageUnknown)
			case !stated:
				// Not said is not zero: settling 0 would refund what
				// the work may have used.
				return nil, fmt.Errorf("the stream's last usage event does not state %s (status %d): %w", field, u.Status, ErrUsageUnknown)
			}
			actual[unit] = value
			if actual[unit] < 0 {
				return nil, fmt.Errorf("usage %s = %d: %w", field, actual[unit], ErrUsageUnknown)
			}
		}
		return actual, nil
	}
}
