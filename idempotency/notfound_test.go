package idempotency_test

import (
	"context"
	"errors"
	"testing"

	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/memstore"
	"github.com/berthq/berth/sdk"
)

// TestHardening15_StoreNotFoundIsSDK checks that an unknown key matches both
// idempotency.ErrNotFound and sdk.ErrNotFound: one "not found" convention
// across berth's packages.
func TestHardening15_StoreNotFoundIsSDK(t *testing.T) {
	if !errors.Is(idempotency.ErrNotFound, sdk.ErrNotFound) {
		t.Error("idempotency.ErrNotFound does not match sdk.ErrNotFound")
	}
	_, err := memstore.New(memstore.Options{}).Get(context.Background(), "unknown:key")
	if !errors.Is(err, idempotency.ErrNotFound) || !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("Get(unknown) = %v, want idempotency.ErrNotFound matching sdk.ErrNotFound", err)
	}
}
