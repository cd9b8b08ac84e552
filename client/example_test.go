package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/capledger/capledger/client"
)

// Run puts one unit of work under a reservation: reserve, start, work,
// settle with what the work reports.
func ExampleClient_Run() {
	c, err := client.New("127.0.0.1:7070", client.WithTimeout(2*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	res, err := c.Run(context.Background(), client.ReserveRequest{
		Subject: "tenant-7", Route: "chat.generate",
		Units:           client.Units{"tokens": 600, "requests": 1},
		EstimatorDigest: "sha256:e57",
		BodyHash:        client.BodyHash([]byte(`{"prompt":"..."}`)),
	}, func(ctx context.Context) (client.Units, error) {
		// Call the backend here; report what it really used.
		return client.Units{"tokens": 212, "requests": 1}, nil
	})
	var rejected *client.RejectedError
	var unknown *client.UsageUnknownError
	switch {
	case errors.As(err, &rejected):
		log.Printf("429: retry after %s (dimension %s)", rejected.RetryAfter, rejected.Dimension)
	case errors.As(err, &unknown):
		// Keep unknown.Receipt; settle it later with c.ResolveUnknown.
		log.Printf("usage unknown for %s", unknown.Receipt.ReservationID)
	case err != nil:
		log.Print(err)
	default:
		log.Printf("settled, %d tokens refunded", res.Refunded["tokens"])
	}
}

// Middleware fronts a handler: estimate, reserve (429 when refused), queue
// fairly, run, settle from a usage header.
func ExampleClient_Middleware() {
	c, err := client.New("127.0.0.1:7070")
	if err != nil {
		log.Fatal(err)
	}
	queue, err := c.NewFairQueue(client.FairQueueConfig{Concurrency: 8, CostUnit: "tokens"})
	if err != nil {
		log.Fatal(err)
	}
	mw, err := c.Middleware(client.MiddlewareConfig{
		Route:   "chat.generate",
		Subject: func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil },
		Estimator: client.NewEstimator("estimator-v1", func(r *http.Request, body []byte) (client.Units, error) {
			maxTokens, _ := strconv.ParseInt(r.URL.Query().Get("max_tokens"), 10, 64)
			return client.Units{"tokens": int64(len(body))/4 + maxTokens, "requests": 1}, nil
		}),
		Usage: client.UsageFromHeaders(map[string]string{"tokens": "X-Usage-Tokens"}),
		Queue: queue,
	})
	if err != nil {
		log.Fatal(err)
	}
	backend := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Usage-Tokens", "128")
		w.Write([]byte("ok"))
	})
	http.Handle("/v1/generate", mw(backend))
}

// RequestDigest computes the canonical digest of docs/CLIENTS.md,
// section 3, here its worked example.
func ExampleRequestDigest() {
	d, err := client.RequestDigest(client.DigestInput{
		Subject: "tenant-7", Route: "chat.generate", Region: "eu-west",
		Units:           client.Units{"tokens": 600, "requests": 1},
		EstimatorDigest: "sha256:e57", BodyHash: "sha256:b0d",
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(d)
	// Output: sha256:7549e55c2efef44af21d83998bf0e6ce35a291f4ed43a77d49a59f85c1057527
}

// The middleware of docs/CLIENTS.md, section 8: an OpenAI-style streaming
// route whose usage comes from the stream's last usage event, queued
// fairly, admitted from the gateway's emergency shard while the ledger is
// unreachable.
func ExampleClient_Middleware_partitionMode() {
	c, err := client.New("ledger:7070")
	if err != nil {
		log.Fatal(err)
	}
	tenantOf := func(r *http.Request) (string, error) {
		if t := r.Header.Get("X-Tenant"); t != "" {
			return t, nil
		}
		return "", errors.New("no tenant") // answered 401
	}
	estimator := client.NewEstimator("sha256:e57", func(r *http.Request, body []byte) (client.Units, error) {
		return client.Units{"tokens": int64(len(body))/4 + 1024, "requests": 1}, nil
	})
	usage := client.UsageFromStream(map[string]string{"tokens": "total_tokens"}, client.Units{"requests": 1})
	queue, err := c.NewFairQueue(client.FairQueueConfig{Concurrency: 64, CostUnit: "tokens"})
	if err != nil {
		log.Fatal(err)
	}
	shards, err := client.OpenShardStore("/var/lib/gateway/shards", client.ShardStoreOptions{GatewayID: "gw-a"})
	if err != nil {
		log.Fatal(err)
	}
	em := client.NewEmergency(c, shards, client.EmergencyOptions{})
	mw, err := c.Middleware(client.MiddlewareConfig{
		Route:     "chat.generate",
		Subject:   tenantOf,
		Estimator: estimator,
		Usage:     usage,
		Queue:     queue,
		Emergency: em,
	})
	if err != nil {
		log.Fatal(err)
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[]}\n\n")
		fmt.Fprint(w, "data: {\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":12,\"total_tokens\":21}}\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	http.Handle("/v1/chat/completions", mw(handler))
}

// SSEUsageScanner reads the usage of an OpenAI-style stream as it passes,
// for code outside the middleware: tee the stream into it.
func ExampleSSEUsageScanner() {
	scanner := client.NewSSEUsageScanner()
	var toCaller strings.Builder // the response going to the caller
	w := io.MultiWriter(&toCaller, scanner)
	fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n")
	fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":12,\"total_tokens\":21}}\n\n")
	fmt.Fprint(w, "data: [DONE]\n\n")
	u, ok := scanner.Usage()
	fmt.Println(ok, u.PromptTokens, u.CompletionTokens, u.TotalTokens, scanner.Done())
	// Output: true 9 12 21 true
}
