package memstore_test

import (
	"testing"

	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/memstore"
	"github.com/berthq/berth/idempotency/storetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) idempotency.Store { return memstore.New(memstore.Options{}) })
}
