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
