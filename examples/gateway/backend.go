package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ChatRequest is the (OpenAI-shaped) body the fake LLM accepts.
type ChatRequest struct {
	Model     string    `json:"model"`
	Messages  []Message `json:"messages"`
	MaxTokens int64     `json:"max_tokens"`
	// Stream asks for server-sent events, OpenAI style: content chunks,
	// then a final event with the usage object, then "data: [DONE]".
	Stream bool `json:"stream"`
}

// Message is one chat message.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ChatResponse is the fake LLM's answer; Usage is what it really used.
type ChatResponse struct {
	Model   string `json:"model"`
	Content string `json:"content"`
	Usage   Usage  `json:"usage"`
}

// Usage reports tokens the way LLM APIs do.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

// UsageHeader carries the total tokens of an answer, for gateways that read
// usage without parsing bodies.
const UsageHeader = "X-Usage-Total-Tokens"

// promptTokens counts a prompt the way the fake model does: about four
// tokens per three words.
func promptTokens(messages []Message) int64 {
	words := 0
	for _, m := range messages {
		words += len(strings.Fields(m.Content))
	}
	return int64(words*4/3 + 1)
}

// fakeLLM is a backend that runs at most `slots` generations at once (a GPU
// box), takes time in proportion to the tokens it generates, and reports
// what it used. It never generates more than max_tokens, and usually less,
// so a gateway that reserved max_tokens gets a refund at settlement.
type fakeLLM struct {
	slots        chan struct{}
	perToken     time.Duration
	mu           sync.Mutex
	rng          *rand.Rand
	maxInFlight  int
	inFlight     int
	servedTokens int64
}

func newFakeLLM(slots int, perToken time.Duration, seed uint64) *fakeLLM {
	return &fakeLLM{slots: make(chan struct{}, slots), perToken: perToken, rng: rand.New(rand.NewPCG(seed, 1))}
}

func (b *fakeLLM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req ChatRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) == 0 {
		http.Error(w, "want a JSON chat request with messages", http.StatusBadRequest)
		return
	}
	if req.MaxTokens <= 0 {
		req.MaxTokens = defaultMaxTokens
	}
	select {
	case b.slots <- struct{}{}:
	case <-r.Context().Done():
		return
	}
	defer func() { <-b.slots }()
	b.mu.Lock()
	b.inFlight++
	b.maxInFlight = max(b.maxInFlight, b.inFlight)
	// The model stops on its own somewhere between a quarter of max_tokens
	// and all of it.
	completion := req.MaxTokens/4 + b.rng.Int64N(req.MaxTokens-req.MaxTokens/4+1)
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.inFlight--
		b.mu.Unlock()
	}()

	usage := Usage{PromptTokens: promptTokens(req.Messages), CompletionTokens: completion}
	usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
	if req.Stream {
		b.stream(w, r, req.Model, usage)
		return
	}
	if err := sleep(r.Context(), time.Duration(completion)*b.perToken); err != nil {
		return // the client hung up; a real GPU might keep going, this one stops
	}
	b.mu.Lock()
	b.servedTokens += usage.TotalTokens
	b.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(UsageHeader, strconv.FormatInt(usage.TotalTokens, 10))
	json.NewEncoder(w).Encode(ChatResponse{
		Model:   req.Model,
		Content: fmt.Sprintf("(%d tokens of a very plausible answer)", completion),
		Usage:   usage,
	})
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stream sends the answer as server-sent events in four chunks over the
// generation time, then the usage (counted as served once it is sent), then
// [DONE]. A client that hangs up mid-stream gets no usage event.
func (b *fakeLLM) stream(w http.ResponseWriter, r *http.Request, model string, usage Usage) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flush := http.NewResponseController(w).Flush
	const chunks = 4
	for i := range chunks {
		if err := sleep(r.Context(), time.Duration(usage.CompletionTokens)*b.perToken/chunks); err != nil {
			return // the client hung up: the model stops, no usage is sent
		}
		chunk, _ := json.Marshal(map[string]any{"model": model, "choices": []any{map[string]any{"delta": map[string]string{
			"content": fmt.Sprintf("(part %d of a very plausible answer)", i+1)}}}})
		fmt.Fprintf(w, "data: %s\n\n", chunk)
		flush()
	}
	final, _ := json.Marshal(map[string]any{"model": model, "choices": []any{}, "usage": usage})
	fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", final)
	flush()
	b.mu.Lock()
	b.servedTokens += usage.TotalTokens
	b.mu.Unlock()
}
