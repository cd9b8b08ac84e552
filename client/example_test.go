package client_test

import (
	"context"
	"errors"
	"log"
	"net/http"
	"strconv"
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
