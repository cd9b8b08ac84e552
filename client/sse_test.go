package client

import (
	"errors"
	"strings"
	"testing"
)

func TestSSEUsageScannerTakesTheLastUsageEvent(t *testing.T) {
	stream := "event: ping\n" +
		"data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1,\"total_tokens\":2}}\n\n" +
		": a comment\n" +
		"data: " + strings.Repeat("x", maxSSELine+10) + "\n\n" + // skipped, not fatal
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":12,\"total_tokens\":21}}\r\n\r\n" +
		"data: {\"choices\":[{\"delta\":{}}],\"usage\":null}\n\n" + // a null usage does not erase it
		"data: [DONE]\n\n"
	for _, chunk := range []int{1, 7, 4096, len(stream)} {
		s := NewSSEUsageScanner()
		for rest := stream; rest != ""; {
			n := min(chunk, len(rest))
			s.Write([]byte(rest[:n]))
			rest = rest[n:]
		}
		u, ok := s.Usage()
		if !ok || u != (StreamUsage{PromptTokens: 9, CompletionTokens: 12, TotalTokens: 21}) || !s.Done() {
			t.Fatalf("chunks of %d: usage %+v %v, done %v", chunk, u, ok, s.Done())
		}
	}
	read := UsageFromStream(map[string]string{"tokens": "total_tokens", "out": "completion_tokens"}, Units{"requests": 1})
	s := NewSSEUsageScanner()
	s.Write([]byte(stream))
	got, err := read(&UsageInfo{Stream: s})
	if err != nil || got["tokens"] != 21 || got["out"] != 12 || got["requests"] != 1 {
		t.Fatalf("usage %v %v", got, err)
	}
	// Cut before the usage event: unknown, never zero.
	cut := NewSSEUsageScanner()
	cut.Write([]byte("data: {\"choices\":[]}\n\n"))
	if _, err := read(&UsageInfo{Stream: cut, Status: 200}); !errors.Is(err, ErrUsageUnknown) {
		t.Fatalf("stream without usage: %v", err)
	}
	if got, err := read(&UsageInfo{Stream: cut, Reported: Units{"tokens": 3}}); err != nil || got["tokens"] != 3 {
		t.Fatalf("reported usage wins: %v %v", got, err)
	}
}

// A usage event that cannot be read replaces the earlier one: the stream's
// final usage is unknown (and Err says why), never the partial figure
// before it; a readable usage event after it counts again.
func TestSSEUsageScannerUnreadableLastUsageIsUnknown(t *testing.T) {
	good := "data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1,\"total_tokens\":2}}\n\n"
	bad := "data: {\"usage\":{\"prompt_tokens\":1,\"total_tokens\":\"many\"}}\n\n"
	s := NewSSEUsageScanner()
	s.Write([]byte(good + bad + "data: [DONE]\n\n"))
	if u, ok := s.Usage(); ok || s.Err() == nil {
		t.Fatalf("usage %+v %v, err %v: want none and the read error", u, ok, s.Err())
	}
	read := UsageFromStream(map[string]string{"tokens": "total_tokens"}, nil)
	if got, err := read(&UsageInfo{Stream: s, Status: 200}); !errors.Is(err, ErrUsageUnknown) || !strings.Contains(err.Error(), "unreadable usage event") {
		t.Fatalf("read %v, %v: want ErrUsageUnknown saying the last usage event is unreadable", got, err)
	}
	s.Write([]byte(good))
	if u, ok := s.Usage(); !ok || u.TotalTokens != 2 || s.Err() != nil {
		t.Fatalf("a readable usage after it: %+v %v %v", u, ok, s.Err())
	}
}

// A usage event on a line over maxSSELine cannot be held, so it cannot be
// read: like an unreadable one it leaves the stream's usage unknown,
// never the earlier event's figure (an undercharge). An over-long data
// line that names no usage is skipped as before.
func TestSSEUsageScannerOverLongUsageLineIsUnknown(t *testing.T) {
	good := "data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1,\"total_tokens\":2}}\n\n"
	long := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", maxSSELine) +
		"\"}}],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":900000,\"total_tokens\":900009}}\n\n"
	for _, chunk := range []int{3, 4096, len(good + long)} {
		s := NewSSEUsageScanner()
		for rest := good + long + "data: [DONE]\n\n"; rest != ""; {
			n := min(chunk, len(rest))
			s.Write([]byte(rest[:n]))
			rest = rest[n:]
		}
		if u, ok := s.Usage(); ok || s.Err() == nil || !s.Done() {
			t.Fatalf("chunks of %d: usage %+v %v, err %v: want none and why", chunk, u, ok, s.Err())
		}
		read := UsageFromStream(map[string]string{"tokens": "total_tokens"}, nil)
		if got, err := read(&UsageInfo{Stream: s, Status: 200}); !errors.Is(err, ErrUsageUnknown) {
			t.Fatalf("chunks of %d: read %v, %v: want ErrUsageUnknown", chunk, got, err)
		}
		// A readable usage after it is the last again.
		s.Write([]byte(good))
		if u, ok := s.Usage(); !ok || u.TotalTokens != 2 || s.Err() != nil {
			t.Fatalf("chunks of %d: a readable usage after it: %+v %v %v", chunk, u, ok, s.Err())
		}
	}
}

// A stream whose upstream closed right after its last line, without a line
// end: that line is the stream's end and is read like any other when it
// is whole JSON (the final usage, not the earlier figure; a `[DONE]`
// counts). When it is not whole (cut mid-line, or over 1 MiB and not
// held) it may be the usage event, cut: the usage is unknown, never the
// earlier, partial figure. Usage, Err and Done leave the held line
// alone, so bytes written after them continue it.
func TestSSEUsageScannerReadsALastLineWithoutLineEnd(t *testing.T) {
	early := "data: {\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"total_tokens\":10}}\n\n"
	final := "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":31,\"total_tokens\":40}}"
	write := func(s *SSEUsageScanner, stream string, chunk int) {
		for rest := stream; rest != ""; {
			n := min(chunk, len(rest))
			s.Write([]byte(rest[:n]))
			rest = rest[n:]
		}
	}
	for _, chunk := range []int{1, 7, 4096} {
		s := NewSSEUsageScanner()
		write(s, early+final, chunk)
		if u, ok := s.Usage(); !ok || u.TotalTokens != 40 || s.Err() != nil || s.Done() {
			t.Fatalf("chunks of %d, final usage without line end: %+v %v, err %v, done %v: want 40 tokens", chunk, u, ok, s.Err(), s.Done())
		}
		s = NewSSEUsageScanner()
		write(s, early+final+"\n\ndata: [DONE]", chunk)
		if u, ok := s.Usage(); !ok || u.TotalTokens != 40 || !s.Done() {
			t.Fatalf("chunks of %d, [DONE] without line end: %+v %v, done %v", chunk, u, ok, s.Done())
		}
	}

	read := UsageFromStream(map[string]string{"tokens": "total_tokens"}, nil)
	for name, last := range map[string]string{
		"cut mid-JSON":           final[:len(final)-20],
		"cut before its name":    final[:len("data: {\"choices\":[],\"usa")],
		"over 1 MiB without end": "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", maxSSELine),
	} {
		s := NewSSEUsageScanner()
		write(s, early+last, 4096)
		if u, ok := s.Usage(); ok || s.Err() == nil {
			t.Fatalf("%s: usage %+v %v, err %v: want none and why (not the earlier 10 tokens)", name, u, ok, s.Err())
		}
		if got, err := read(&UsageInfo{Stream: s, Status: 200}); !errors.Is(err, ErrUsageUnknown) || !strings.Contains(err.Error(), "unreadable usage event") {
			t.Fatalf("%s: read %v, %v: want ErrUsageUnknown saying the last usage event is unreadable", name, got, err)
		}
	}

	// Asked mid-line, the scanner answers for a stream ending there, and
	// the rest of the line still lands on it.
	s := NewSSEUsageScanner()
	write(s, early+final[:30], 4096)
	if _, ok := s.Usage(); ok || s.Err() == nil {
		t.Fatalf("mid-line: usage %v, err %v: want unknown", ok, s.Err())
	}
	write(s, final[30:]+"\n\n", 4096)
	if u, ok := s.Usage(); !ok || u.TotalTokens != 40 || s.Err() != nil {
		t.Fatalf("after the rest of the line: %+v %v %v", u, ok, s.Err())
	}
	// A whole last line without a usage leaves the earlier one.
	s = NewSSEUsageScanner()
	write(s, early+"data: {\"choices\":[{\"delta\":{\"content\":\"bye\"}}]}", 4096)
	if u, ok := s.Usage(); !ok || u.TotalTokens != 10 || s.Err() != nil {
		t.Fatalf("a whole last line without usage: %+v %v %v", u, ok, s.Err())
	}
}

// writeInChunks writes stream to s chunk bytes at a time.
func writeInChunks(s *SSEUsageScanner, stream string, chunk int) {
	for rest := stream; rest != ""; {
		n := min(chunk, len(rest))
		s.Write([]byte(rest[:n]))
		rest = rest[n:]
	}
}

// Lines end in CRLF, LF or a bare CR, as the SSE specification says; a
// CRLF split between two writes is one line end, not a blank line.
func TestSSEUsageScannerReadsEveryLineEnd(t *testing.T) {
	early := `data: {"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}`
	final := `data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":31,"total_tokens":40}}`
	for name, eol := range map[string]string{"LF": "\n", "CRLF": "\r\n", "CR": "\r"} {
		stream := ": comment" + eol + early + eol + eol + "event: x" + eol + final + eol + eol + "data: [DONE]" + eol + eol
		for _, chunk := range []int{1, 2, 7, len(stream)} {
			s := NewSSEUsageScanner()
			writeInChunks(s, stream, chunk)
			if u, ok := s.Usage(); !ok || u.TotalTokens != 40 || s.Err() != nil || !s.Done() {
				t.Fatalf("%s, chunks of %d: usage %+v %v, err %v, done %v: want 40 tokens and [DONE]", name, chunk, u, ok, s.Err(), s.Done())
			}
		}
	}
	// A CR then an LF in the next write is one line end: the data line
	// is not ended twice (which would dispatch it early, alone).
	s := NewSSEUsageScanner()
	writeInChunks(s, "data: {\"choices\":[],\r", 100)
	writeInChunks(s, "\ndata: \"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,\"total_tokens\":3}}\r\n\r\n", 100)
	if u, ok := s.Usage(); !ok || u.TotalTokens != 3 || s.Err() != nil {
		t.Fatalf("CRLF split between writes: %+v %v %v", u, ok, s.Err())
	}
}

// An event's data is its data lines joined by "\n": a JSON object split
// over several is read whole, at the blank line that ends the event.
func TestSSEUsageScannerJoinsTheDataLinesOfAnEvent(t *testing.T) {
	stream := "data: {\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"total_tokens\":10}}\n\n" +
		"data: {\"choices\":[],\n" +
		"data:\"usage\":{\"prompt_tokens\":9,\n" + // no space after the colon is fine too
		": a comment inside the event\n" +
		"id: 7\n" +
		"data:  \"completion_tokens\":31,\"total_tokens\":40}}\n" +
		"\n" +
		"data\n\n" + // an event of empty data: nothing
		"data: [DONE]\n\n"
	for _, chunk := range []int{1, 5, len(stream)} {
		s := NewSSEUsageScanner()
		writeInChunks(s, stream, chunk)
		if u, ok := s.Usage(); !ok || u.TotalTokens != 40 || u.CompletionTokens != 31 || s.Err() != nil || !s.Done() {
			t.Fatalf("chunks of %d: usage %+v %v, err %v, done %v: want 40 tokens", chunk, u, ok, s.Err(), s.Done())
		}
	}
	// Two whole objects in one event are not one JSON value: unreadable.
	s := NewSSEUsageScanner()
	writeInChunks(s, "data: {\"usage\":{\"total_tokens\":10}}\n\n"+
		"data: {\"usage\":{\"total_tokens\":20}}\ndata: {\"usage\":{\"total_tokens\":30}}\n\n", 4096)
	if u, ok := s.Usage(); ok || s.Err() == nil {
		t.Fatalf("two objects in one event: %+v %v, err %v: want unknown", u, ok, s.Err())
	}
}

// A stream cut between two data lines of its final event (at a line
// boundary, before the blank line) has no certain final usage: unknown,
// never the earlier figure. Cut inside the field name of what may be a
// data line, the same.
func TestSSEUsageScannerCutInsideAnEventIsUnknown(t *testing.T) {
	early := "data: {\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"total_tokens\":10}}\n\n"
	for name, last := range map[string]string{
		"after the first of its data lines, LF":   "data: {\"choices\":[],\n",
		"after the first of its data lines, CR":   "data: {\"choices\":[],\r",
		"after the first of its data lines, CRLF": "data: {\"choices\":[],\r\n",
		"after a comment inside it":               "data: {\"choices\":[],\n: keep-alive\n",
		"inside the field name":                   "da",
	} {
		s := NewSSEUsageScanner()
		writeInChunks(s, early+last, 4096)
		if u, ok := s.Usage(); ok || s.Err() == nil {
			t.Errorf("%s: usage %+v %v, err %v: want unknown, not the earlier 10 tokens", name, u, ok, s.Err())
		}
	}
	// The rest of the event, written after, is read.
	s := NewSSEUsageScanner()
	writeInChunks(s, early+"data: {\"choices\":[],\n", 4096)
	if _, ok := s.Usage(); ok {
		t.Fatal("cut between data lines: usage known")
	}
	writeInChunks(s, "data: \"usage\":{\"prompt_tokens\":9,\"completion_tokens\":31,\"total_tokens\":40}}\n\n", 4096)
	if u, ok := s.Usage(); !ok || u.TotalTokens != 40 || s.Err() != nil {
		t.Fatalf("the rest of the event: %+v %v %v", u, ok, s.Err())
	}
	// A whole event of other fields, cut before its blank line, leaves
	// the earlier usage.
	s = NewSSEUsageScanner()
	writeInChunks(s, early+"event: ping\n", 4096)
	if u, ok := s.Usage(); !ok || u.TotalTokens != 10 {
		t.Fatalf("cut after a non-data line: %+v %v %v", u, ok, s.Err())
	}
}

// The scanner holds at most maxSSELine bytes (the event's data and the
// current line together) however its data is split: an event whose data
// lines add up to more and that names "usage" cannot be read, so the
// usage is unknown; one that does not is skipped.
func TestSSEUsageScannerBoundsAnEventOfManyDataLines(t *testing.T) {
	early := "data: {\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"total_tokens\":10}}\n\n"
	line := "data: " + strings.Repeat("x", 4096) + "\n"
	var many strings.Builder
	for many.Len() < 2*maxSSELine {
		many.WriteString(line)
	}
	for name, tc := range map[string]struct {
		event string
		known bool
	}{
		"naming usage at its end":   {many.String() + "data: \"usage\":{\"total_tokens\":99}}\n\n", false},
		"naming usage at its start": {"data: {\"usage\":{\"total_tokens\":99},\n" + many.String() + "\n", false},
		"naming no usage":           {many.String() + "\n", true},
	} {
		s := NewSSEUsageScanner()
		for rest := early + tc.event; rest != ""; {
			n := min(65536, len(rest))
			s.Write([]byte(rest[:n]))
			rest = rest[n:]
			if held := len(s.data) + len(s.line); held > maxSSELine {
				t.Fatalf("%s: holds %d bytes, over %d", name, held, maxSSELine)
			}
		}
		u, ok := s.Usage()
		if tc.known && (!ok || u.TotalTokens != 10) || !tc.known && (ok || s.Err() == nil) {
			t.Fatalf("%s: usage %+v %v, err %v", name, u, ok, s.Err())
		}
	}
}

// The specification ignores one byte order mark at the start of a
// stream, however the writes split it; one later in the stream is data.
func TestSSEUsageScannerIgnoresALeadingByteOrderMark(t *testing.T) {
	event := "data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,\"total_tokens\":3}}\n\n"
	for _, writes := range [][]string{
		{"\xEF\xBB\xBF" + event},
		{"\xEF", "\xBB", "\xBF", event},
		{"\xEF\xBB", "\xBF" + event},
	} {
		s := NewSSEUsageScanner()
		for _, w := range writes {
			s.Write([]byte(w))
		}
		if u, ok := s.Usage(); !ok || u.TotalTokens != 3 {
			t.Errorf("%q: usage %+v %v (%v), want total 3", writes, u, ok, s.Err())
		}
	}
	s := NewSSEUsageScanner()
	s.Write([]byte(event + "\xEF\xBB\xBF" + strings.ReplaceAll(event, "3}", "4}")))
	if u, ok := s.Usage(); !ok || u.TotalTokens != 3 {
		t.Errorf("a byte order mark after the start makes its line no data line: usage %+v %v, want total 3", u, ok)
	}
}
