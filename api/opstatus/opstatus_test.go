package opstatus

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

var secret = []byte("0123456789abcdef-shared")

// gateway answers every request with answer(w, r) after checking the
// request's signature as a gateway must.
func gateway(t *testing.T, answer func(w http.ResponseWriter, r *http.Request)) *Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		op := strings.TrimPrefix(r.URL.Path, "/operations/")
		if err := VerifyRequest(secret, r, r.URL.Query().Get("reservationId"), op, time.Now()); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		answer(w, r)
	}))
	t.Cleanup(srv.Close)
	return &Client{Base: srv.URL, Secret: secret, HTTP: &http.Client{Timeout: 300 * time.Millisecond}}
}

func signed(a Answer) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) { WriteAnswer(w, r, secret, a) }
}

func raw(code int, body string) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(code); _, _ = w.Write([]byte(body)) }
}

func TestGetTakesOnlyVerifiedAnswers(t *testing.T) {
	ctx := context.Background()
	const res, op = "rsv_1", "op/1 ?" // escaped in the path
	ok := []struct {
		name   string
		answer func(w http.ResponseWriter, r *http.Request)
		status string
		units  int64
	}{
		{"finished", signed(Answer{OperationID: op, ReservationID: res, Status: StatusFinished, ActualUnits: map[string]int64{"tokens": 812}}), StatusFinished, 812},
		{"never started", signed(Answer{OperationID: op, ReservationID: res, Status: StatusNeverStarted}), StatusNeverStarted, 0},
		{"running unsigned", raw(200, `{"operationId":"op/1 ?","reservationId":"rsv_1","status":"running"}`), StatusRunning, 0},
		{"404", raw(404, "no such operation"), StatusUnknown, 0},
	}
	for _, c := range ok {
		got, err := gateway(t, c.answer).Get(ctx, res, op)
		if err != nil || got.Status != c.status || got.Units["tokens"] != c.units {
			t.Errorf("%s: %+v %v, want %s %d", c.name, got, err, c.status, c.units)
		}
	}
	// answered: the endpoint gave an answer that cannot be used
	// (ErrBadAnswer); the others could not answer.
	refused := gateway(t, signed(Answer{}))
	refused.Base = "http://127.0.0.1:1"
	bad := []struct {
		name     string
		client   *Client
		answered bool
	}{
		{"unsigned never started", gateway(t, raw(200, `{"operationId":"op/1 ?","reservationId":"rsv_1","status":"never_started"}`)), true},
		{"unsigned finished", gateway(t, raw(200, `{"operationId":"op/1 ?","reservationId":"rsv_1","status":"finished","actualUnits":{"tokens":0}}`)), true},
		{"signed for another operation", gateway(t, signed(Answer{OperationID: "op-2", ReservationID: res, Status: StatusNeverStarted})), true},
		{"5xx", gateway(t, raw(503, "busy")), false},
		{"429", gateway(t, raw(429, "slow down")), false},
		{"408", gateway(t, raw(408, "request timeout")), false},
		{"4xx", gateway(t, raw(400, "bad request")), true},
		{"garbage", gateway(t, raw(200, "<html>")), true},
		{"unknown status", gateway(t, signed(Answer{OperationID: op, ReservationID: res, Status: "done"})), true},
		{"negative units", gateway(t, signed(Answer{OperationID: op, ReservationID: res, Status: StatusFinished, ActualUnits: map[string]int64{"tokens": -1}})), true},
		{"timeout", gateway(t, func(w http.ResponseWriter, r *http.Request) { time.Sleep(time.Second) }), false},
		{"refused", refused, false},
		{"wrong secret", &Client{Base: gateway(t, signed(Answer{OperationID: op, ReservationID: res, Status: StatusNeverStarted})).Base, Secret: []byte("another-secret-of-16")}, true},
	}
	for _, c := range bad {
		got, err := c.client.Get(ctx, res, op)
		if err == nil {
			t.Errorf("%s: took %+v, want an error", c.name, got)
		} else if errors.Is(err, ErrBadAnswer) != c.answered {
			t.Errorf("%s: %v: wraps ErrBadAnswer %v, want %v", c.name, err, errors.Is(err, ErrBadAnswer), c.answered)
		}
	}
	if _, err := bad[0].client.Get(ctx, res, op); !errors.Is(err, ErrUnsigned) {
		t.Errorf("unsigned never started: %v, want ErrUnsigned", err)
	}
}

func TestAnswerSignatureBindsTheRequest(t *testing.T) {
	body := []byte(`{"status":"never_started"}`)
	a := SignAnswer(secret, "100", "r", "o", body)
	for _, other := range []string{
		SignAnswer(secret, "101", "r", "o", body), SignAnswer(secret, "100", "r2", "o", body),
		SignAnswer(secret, "100", "r", "o2", body), SignAnswer(secret, "100", "r", "o", append(body, ' ')),
		SignRequest(secret, "100", "r", "o"),
	} {
		if other == a {
			t.Fatalf("two different messages share the signature %s", a)
		}
	}
	r := httptest.NewRequest("GET", "/operations/o", nil)
	r.Header.Set(HeaderTimestamp, "100")
	r.Header.Set(HeaderSignature, SignRequest(secret, "100", "r", "o"))
	if err := VerifyRequest(secret, r, "r", "o", time.Unix(100, 0).Add(MaxSkew+time.Second)); err == nil {
		t.Fatal("a request older than MaxSkew verified")
	}
	if err := VerifyRequest(secret, r, "r", "o", time.Unix(100, 0)); err != nil {
		t.Fatal(err)
	}
}
