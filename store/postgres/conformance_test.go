package postgres_test

import (
	"testing"

	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, _ := openStore(t)
		return s
	})
}
