package postgres_test

import (
	"testing"

	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
	"github.com/capledger/capledger/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, _ := openStore(t)
		return s
	})
}

// TestAuditReadsInPagesOfOne: the account streams' keyset pages cross
// every boundary (pages of one row).
func TestAuditReadsInPagesOfOne(t *testing.T) {
	defer postgres.SetAccountPage(1)()
	storetest.RunAuditReads(t, func(t *testing.T) store.Store {
		s, _ := openStore(t)
		return s
	})
}
