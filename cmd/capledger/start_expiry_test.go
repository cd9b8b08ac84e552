package main

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestStartRacesExpiryAcrossReplicas: executors start 2 s holds at
// instants spread around their expiry, through both replicas of one
// PostgreSQL database, while the expiry worker of whichever replica leads
// claims the holds it finds due; some starts' answers are lost and
// retried with the same ids on the other replica. Each reservation ends
// one way only: an acknowledged start leaves it STARTED (the worker never
// expires it afterwards), a start refused as expired leaves it EXPIRED
// with its hold refunded once, and a start sent after the hold was seen
// EXPIRED is refused. The started work's settles charge the usage and
// refund the rest once (a repeated settle refunds nothing); available
// never goes negative, the terms are the burst minus the usage, and
// `capledger audit` is clean. On SQLite every call goes to one process.
func TestStartRacesExpiryAcrossReplicas(t *testing.T) {
	onTwoReplicasAndSQLite(t, testStartRacesExpiry)
}

func testStartRacesExpiry(t *testing.T, bin, lossyURL, otherURL string) {
	const (
		subject = "tenant-race"
		holds   = 36
		hold    = 100 // tokens per reservation
		used    = 60  // tokens each started operation uses
		holdTTL = 2 * time.Second
	)
	lossy := newLossyLink(t, lossyURL)
	mustPost(t, otherURL, "PublishPolicy", fmt.Sprintf(`{"policy":{"subject":"*","route":"race","holdTtl":"2s","epochLength":"315360000s",
	  "dimensions":[{"unit":"tokens","burst":"%d"}]}}`, holds*hold))
	id := func(i int) string { return fmt.Sprintf("race-%02d", i) }
	// waitExpired waits until id is EXPIRED and reports whether it got
	// there within a minute; it may run on any goroutine.
	waitExpired := func(id string) bool {
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			status, out := post(crashClient, otherURL, "GetReservation", fmt.Sprintf(`{"reservationId":%q}`, id))
			if status == 200 && asMap(out["reservation"])["state"] == "RESERVATION_STATE_EXPIRED" {
				return true
			}
		}
		t.Errorf("%s is not EXPIRED 60 s after its TTL of %v", id, holdTTL)
		return false
	}

	// Three groups, by i%3: 0 starts at once (before the expiry, unless
	// the machine stalls), 1 starts at the expiry instant give or take
	// 300 ms (the race), 2 starts only once its hold was seen EXPIRED.
	reservedAt := make([]time.Time, holds)
	for i := range holds {
		url := []string{lossyURL, otherURL}[i%2]
		mustPost(t, url, "Reserve", fmt.Sprintf(`{"reservationId":%q,"subject":%q,"route":"race","units":{"tokens":%d}}`, id(i), subject, hold))
		reservedAt[i] = time.Now()
	}
	// started[i]: the start was acknowledged (STARTED, first or replayed);
	// otherwise it was refused as expired.
	started := make([]bool, holds)
	var wg sync.WaitGroup
	for i := range holds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch i % 3 {
			case 1:
				offset := holdTTL - 300*time.Millisecond + time.Duration(i)*600*time.Millisecond/holds
				time.Sleep(time.Until(reservedAt[i].Add(offset)))
			case 2:
				if !waitExpired(id(i)) {
					return
				}
			}
			body := fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s"}`, id(i), id(i))
			first := otherURL
			if i%2 == 1 {
				// Through the proxy, with an answer lost now and then
				// (whichever call's answer comes next: every call through
				// the proxy retries a lost answer on the other replica).
				first = lossy.url
				if i%4 == 1 {
					lossy.proxy.DropNextResponses(1)
				}
			}
			status, out := post(crashClient, first, "Start", body)
			if status == 0 {
				status, out = post(crashClient, otherURL, "Start", body)
			}
			reason, _ := field(out, "details", "0", "debug", "reason").(string)
			switch {
			case status == 200 && asMap(out["reservation"])["state"] == "RESERVATION_STATE_STARTED":
				started[i] = true
			case status == 400 && reason == "RESERVATION_EXPIRED":
			default:
				t.Errorf("start %s: %d %v, want STARTED or refused as expired", id(i), status, out)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	// A sentinel hold reserved after every start was answered expires
	// after all the others: once it is EXPIRED, the worker has had every
	// hold above past its TTL in a listing.
	mustPost(t, otherURL, "Reserve", fmt.Sprintf(`{"reservationId":"sentinel","subject":%q,"route":"race","units":{"tokens":1}}`, subject))
	if !waitExpired("sentinel") {
		return
	}

	startedCount := 0
	for i := range holds {
		got := asMap(mustPost(t, otherURL, "GetReservation", fmt.Sprintf(`{"reservationId":%q}`, id(i)))["reservation"])["state"]
		switch {
		case started[i] && got != "RESERVATION_STATE_STARTED":
			t.Errorf("%s: start acknowledged, then %v", id(i), got)
		case !started[i] && got != "RESERVATION_STATE_EXPIRED":
			t.Errorf("%s: start refused as expired, now %v", id(i), got)
		case i%3 == 2 && started[i]:
			t.Errorf("%s: started after it was seen EXPIRED", id(i))
		}
		if started[i] {
			startedCount++
		}
	}
	t.Logf("%d of %d holds started, %d expired", startedCount, holds, holds-startedCount)

	// The started work settles (through the proxy, some answers lost and
	// retried on the other replica), then every settle is sent again: each
	// refunds hold-used once, the repetitions nothing.
	for i := range holds {
		if !started[i] {
			continue
		}
		body := fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s","actualUnits":{"tokens":%d}}`, id(i), id(i), used)
		if i%2 == 0 {
			lossy.lose("Settle", body)
		} else if out := mustPost(t, lossy.url, "Settle", body); fmt.Sprint(asMap(out["refundedUnits"])["tokens"]) != fmt.Sprint(hold-used) {
			t.Errorf("settle %s: %v, want %d refunded", id(i), out, hold-used)
		}
		if out := mustPost(t, otherURL, "Settle", body); out["replayed"] != true || len(asMap(out["refundedUnits"])) != 0 {
			t.Errorf("settle %s sent again: %v, want a replay refunding nothing", id(i), out)
		}
	}

	tm := routeTerms(t, otherURL, subject, "race")
	checkConservation(t, subject, tm)
	spent := int64(startedCount * used)
	if m := tm["tokens"]; m["available"] != holds*hold-spent || m["reserved"] != 0 || m["spent"] != spent {
		t.Errorf("%s: %v, want available %d, reserved 0, spent %d", subject, m, holds*hold-spent, spent)
	}
	auditProcess(t, bin, otherURL)
}
