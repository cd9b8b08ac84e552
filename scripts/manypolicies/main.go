// Command manypolicies measures a server holding many policies, one per
// subject, as a platform with a policy per tenant has
// (docs/PERFORMANCE.md, "Many policies"). Against a running `serve`
// (-addr, auth off), it publishes -policies policies for subjects
// <prefix>0, <prefix>1, ... with -concurrency callers, printing the rate
// of each tenth, then times -calls calls of each of: a publish, GetPolicy,
// GetAccount, a reserve for a subject without a policy (a miss, spaced
// past the server's 100 ms miss reload interval) and a reserve for a
// subject with one, and prints the median and the slowest of each. Then,
// with one account in debt made first (a reserve, start and settle above
// the burst for <prefix>2 or -debtor), it times the reads that show accounts with
// their policies: ListDebts, ListAccountStandings (in debt, all, one
// subject), GetFairness and DrainProgress of one generation, each call a
// new question (another limit or generation: the server shares the
// answer to one asked again within a while), and ListPolicies of one
// subject.
//
// With -accounts N the first N subjects get an account each first (a
// reserve and its release), so the pages of accounts these reads show
// are of N tenants with a policy each.
//
// Usage: go run ./scripts/manypolicies -addr 127.0.0.1:7070 -policies 100000
//
//	go run ./scripts/manypolicies -addr 127.0.0.1:7070 -policies 0   (time the calls only)
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:7070", "serve's address")
	policies := flag.Int("policies", 100000, "policies to publish first (0: none)")
	concurrency := flag.Int("concurrency", 8, "callers publishing")
	prefix := flag.String("prefix", "t", "subject prefix of the published policies")
	calls := flag.Int("calls", 5, "timed calls of each kind")
	debtor := flag.String("debtor", "", "subject put in debt before the timed reads (default <prefix>2; another on a second run: a debtor admits nothing)")
	accounts := flag.Int("accounts", 0, "subjects <prefix>0 ... given an account each (a reserve, then its release) after publishing, so the reads show pages of tenants with a policy each")
	flag.Parse()
	c := &caller{base: "http://" + *addr + "/capledger.v1.", http: &http.Client{Timeout: time.Minute}}

	if *policies > 0 {
		var next atomic.Int64
		tenth := max(*policies/10, 1)
		start, last := time.Now(), time.Now()
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range *concurrency {
			wg.Go(func() {
				for {
					i := int(next.Add(1)) - 1
					if i >= *policies {
						return
					}
					c.must("PublishPolicy", policyBody(fmt.Sprintf("%s%d", *prefix, i)))
					if (i+1)%tenth == 0 {
						mu.Lock()
						now := time.Now()
						fmt.Printf("published %d: %.0f a second over the last %d\n", i+1, float64(tenth)/now.Sub(last).Seconds(), tenth)
						last = now
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		fmt.Printf("published %d policies in %s\n", *policies, time.Since(start).Round(time.Millisecond))
	}

	if *accounts > 0 {
		var next atomic.Int64
		start := time.Now()
		var wg sync.WaitGroup
		for range *concurrency {
			wg.Go(func() {
				for {
					i := int(next.Add(1)) - 1
					if i >= *accounts {
						return
					}
					id := fmt.Sprintf("mp-acct-%d-%d", start.UnixNano(), i)
					c.must("Reserve", fmt.Sprintf(`{"reservationId":%q,"subject":"%s%d","route":"chat","units":{"tokens":1}}`, id, *prefix, i))
					c.must("Release", fmt.Sprintf(`{"reservationId":%q}`, id))
				}
			})
		}
		wg.Wait()
		fmt.Printf("gave %d subjects an account in %s\n", *accounts, time.Since(start).Round(time.Millisecond))
	}

	subject := *prefix + "1"
	c.must("Reserve", fmt.Sprintf(`{"reservationId":"mp-warm-%d","subject":%q,"route":"chat","units":{"tokens":1}}`, time.Now().UnixNano(), subject))
	if *debtor == "" {
		*debtor = *prefix + "2"
	}
	debtID := fmt.Sprintf("mp-debt-%d", time.Now().UnixNano())
	c.must("Reserve", fmt.Sprintf(`{"reservationId":%q,"subject":%q,"route":"chat","units":{"tokens":1}}`, debtID, *debtor))
	kinds := []struct {
		name   string
		method string
		body   func(i int) string
		status int
	}{
		{"publish", "PublishPolicy", func(i int) string { return policyBody(fmt.Sprintf("mp-new-%d-%d", time.Now().UnixNano(), i)) }, 200},
		{"GetPolicy", "GetPolicy", func(int) string { return `{"generation":"1"}` }, 200},
		{"GetAccount", "GetAccount", func(int) string { return fmt.Sprintf(`{"subject":%q,"route":"chat"}`, subject) }, 200},
		{"reserve, a miss", "Reserve", func(i int) string {
			time.Sleep(150 * time.Millisecond)
			return fmt.Sprintf(`{"reservationId":"mp-miss-%d-%d","subject":"mp-nobody","route":"chat","units":{"tokens":1}}`, time.Now().UnixNano(), i)
		}, 404},
		{"reserve", "Reserve", func(i int) string {
			return fmt.Sprintf(`{"reservationId":"mp-hit-%d-%d","subject":%q,"route":"chat","units":{"tokens":1}}`, time.Now().UnixNano(), i, subject)
		}, 200},
	}
	// The debtor's reservation: started, then settled at twice its burst.
	c.must("Start", fmt.Sprintf(`{"reservationId":%q,"operationId":"mp-op"}`, debtID))
	c.must("Settle", fmt.Sprintf(`{"reservationId":%q,"operationId":"mp-op","actualUnits":{"tokens":2000}}`, debtID))
	kinds = append(kinds, []struct {
		name   string
		method string
		body   func(i int) string
		status int
	}{
		{"ListDebts", "ListDebts", func(int) string { return `{}` }, 200},
		{"standings, debt", "ConsoleService/ListAccountStandings", func(i int) string { return fmt.Sprintf(`{"inDebt":true,"limit":%d}`, i+1) }, 200},
		{"standings, all", "ConsoleService/ListAccountStandings", func(i int) string { return fmt.Sprintf(`{"limit":%d}`, i+1) }, 200},
		{"standings, one", "ConsoleService/ListAccountStandings", func(i int) string { return fmt.Sprintf(`{"subject":%q,"limit":%d}`, subject, i+1) }, 200},
		{"GetFairness", "ConsoleService/GetFairness", func(i int) string { return fmt.Sprintf(`{"limit":%d}`, i+1) }, 200},
		{"DrainProgress", "RolloutService/DrainProgress", func(i int) string { return fmt.Sprintf(`{"generations":["%d"]}`, i+1) }, 200},
		{"policies of one", "ListPolicies", func(i int) string { return fmt.Sprintf(`{"subject":"%s%d"}`, *prefix, i*7+1) }, 200},
	}...)
	if *calls <= 0 {
		return // publishing only: nothing to time
	}
	for _, k := range kinds {
		var took []time.Duration
		for i := range *calls {
			body := k.body(i)
			t0 := time.Now()
			status, raw := c.call(k.method, body)
			took = append(took, time.Since(t0))
			if status != k.status {
				log.Fatalf("%s: %d %s, want %d", k.name, status, raw, k.status)
			}
		}
		slices.Sort(took)
		fmt.Printf("%-16s median %8.1f ms, slowest %8.1f ms (%d calls)\n", k.name, ms(took[len(took)/2]), ms(took[len(took)-1]), len(took))
	}
}

func policyBody(subject string) string {
	return fmt.Sprintf(`{"policy":{"subject":%q,"route":"chat","dimensions":[{"unit":"tokens","burst":"1000","refillUnits":"10","refillInterval":"1s"}]}}`, subject)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

type caller struct {
	base string
	http *http.Client
}

// call posts body to method, "Service/Method" or a LedgerService method.
func (c *caller) call(method, body string) (int, []byte) {
	if !strings.Contains(method, "/") {
		method = "LedgerService/" + method
	}
	resp, err := c.http.Post(c.base+method, "application/json", bytes.NewBufferString(body))
	if err != nil {
		log.Fatalf("%s: %v", method, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

func (c *caller) must(method, body string) {
	if status, raw := c.call(method, body); status != http.StatusOK {
		log.Fatalf("%s %s: %d %s", method, body, status, raw)
	}
}
