package ledger_test

import (
	"testing"

	"github.com/capledger/capledger/ledger"
)

// Memory remembers a subject's current account beside its generation, to
// answer Account without a second lookup. A row put anew under the same key
// must replace the remembered one: Account returns the row last put.
func TestMemoryAccountIsTheRowLastPut(t *testing.T) {
	m := ledger.NewMemory()
	subject := ledger.PolicyKey{Subject: "tenant-1", Route: "chat", Region: "eu"}
	key := ledger.AccountKey{Subject: subject.Subject, Route: subject.Route, Region: subject.Region, Generation: 7}
	other := ledger.AccountKey{Subject: "tenant-2", Route: "chat", Region: "eu", Generation: 7}

	m.AccountPut(&ledger.Account{Key: key, Version: 1})
	m.AccountPut(&ledger.Account{Key: other})
	m.AccountCurrentPut(subject, 7)
	if g, ok := m.AccountCurrent(subject); !ok || g != 7 {
		t.Fatalf("current = %d, %v", g, ok)
	}
	m.AccountPut(&ledger.Account{Key: key, Version: 2}) // a new row, not the one read
	m.Account(other)                                    // the last-read cache now holds another row
	if a, ok := m.Account(key); !ok || a.Version != 2 {
		t.Fatalf("Account after a new row was put = %+v, %v; want version 2", a, ok)
	}
	if g, ok := m.AccountCurrent(subject); !ok || g != 7 {
		t.Fatalf("current after the put = %d, %v", g, ok)
	}
}

// Rows handed out by NewReservation are zeroed and distinct.
func TestMemoryNewReservationRowsAreFreshAndDistinct(t *testing.T) {
	m := ledger.NewMemory()
	seen := map[*ledger.Reservation]bool{}
	for i := range 200 { // more than one slab
		r := m.NewReservation()
		if *r != (ledger.Reservation{}) {
			t.Fatalf("row %d is not zero: %+v", i, *r)
		}
		if seen[r] {
			t.Fatalf("row %d handed out twice", i)
		}
		seen[r] = true
		r.ID = "written" // a later row must not see this
	}
}
