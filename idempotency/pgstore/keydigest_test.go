package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/idempotency"
)

// TestHardening11_ClaimLostErrorNamesKeyByDigest: issue 11 item 11. A
// fenced call that finds its claim gone returned an error quoting the key;
// the guard logs it at WARN ("recording the result failed; retrying"). It
// names the key by its digest.
func TestHardening11_ClaimLostErrorNamesKeyByDigest(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const key = "payment:customer-4711:invoice-2026-12"
	c := idempotency.Claim{Key: key, JobType: "t", Fingerprint: "fp", Owner: "owner-a", Lease: time.Minute, Retention: time.Hour}
	if out, _, err := e.store.Claim(ctx, c); err != nil || out != idempotency.Acquired {
		t.Fatalf("Claim = %v, %v; want Acquired", out, err)
	}
	c.Owner = "owner-b" // not the owner: the fence refuses
	err := e.store.Complete(ctx, c, idempotency.Result{})
	if !errors.Is(err, idempotency.ErrClaimLost) {
		t.Fatalf("Complete by another owner = %v, want ErrClaimLost", err)
	}
	if strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), idempotency.KeyDigest(key)) {
		t.Errorf("error %q: want the key's digest %s, not the key", err, idempotency.KeyDigest(key))
	}
}
