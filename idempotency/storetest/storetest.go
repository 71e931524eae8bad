// Package storetest is the conformance suite every idempotency store runs:
// claims, fencing, the exactly-once takeover of an expired claim, results,
// transactions that block a concurrent duplicate, and bounded retention.
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) idempotency.Store { return memstore.New(memstore.Options{}) })
//	}
//
// Each case gets a fresh store from newStore and keys of its own.
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/idempotency"
)

// Run runs every case against the stores newStore returns. Transaction
// cases are skipped, with the reason, when the store is not an
// [idempotency.TxStore].
func Run(t *testing.T, newStore func(t *testing.T) idempotency.Store) {
	cases := []struct {
		name string
		fn   func(t *testing.T, s idempotency.Store)
	}{
		{"ClaimCompleteDuplicate", testClaimCompleteDuplicate},
		{"ReleaseFreesKey", testReleaseFreesKey},
		{"FencedByOwner", testFencedByOwner},
		{"CompleteRepeatedByOwner", testCompleteRepeatedByOwner},
		{"RecordsAreCopies", testRecordsAreCopies},
		{"ExpiredClaimTakenOverOnce", testTakeoverOnce},
		{"NoTakeoverWithOtherFingerprint", testNoTakeoverOtherFingerprint},
		{"ExtendKeepsClaim", testExtendKeepsClaim},
		{"InProgressReportsLockedFor", testLockedFor},
		{"GetUnknown", testGetUnknown},
		{"DeleteExpiredBounded", testDeleteExpiredBounded},
		{"TxCommitBlocksDuplicate", testTxCommit},
		{"TxRollbackFreesKey", testTxRollback},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.fn(t, newStore(t)) })
	}
}

func token() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func claim(key, fp string) idempotency.Claim {
	return idempotency.Claim{Key: key, JobType: "test.job", Fingerprint: fp, Owner: token(), Lease: time.Minute, Retention: time.Hour}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustClaim(t *testing.T, s idempotency.Store, c idempotency.Claim, want idempotency.Outcome) *idempotency.Record {
	t.Helper()
	out, rec, err := s.Claim(ctxT(t), c)
	if err != nil {
		t.Fatalf("Claim(%s): %v", c.Key, err)
	}
	if out != want {
		t.Fatalf("Claim(%s) = %v, want %v", c.Key, out, want)
	}
	return rec
}

func testClaimCompleteDuplicate(t *testing.T, s idempotency.Store) {
	ctx := ctxT(t)
	key := "charge:order_" + token() + ":v1"
	a := claim(key, "fp1")
	mustClaim(t, s, a, idempotency.Acquired)
	b := claim(key, "fp1")
	rec := mustClaim(t, s, b, idempotency.InProgress)
	if rec.Status != idempotency.StatusInProgress || rec.Fingerprint != "fp1" || rec.JobType != "test.job" {
		t.Fatalf("in-progress record = %+v", rec)
	}
	res := idempotency.Result{ResourceType: "order", ResourceID: "order_1", JSON: []byte(`{"charge_id":"ch_1"}`)}
	if err := s.Complete(ctx, a, res); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	rec = mustClaim(t, s, b, idempotency.Completed)
	if rec.Status != idempotency.StatusCompleted || rec.Result.ResourceType != "order" || rec.Result.ResourceID != "order_1" || rec.CompletedAt.IsZero() {
		t.Fatalf("completed record = %+v", rec)
	}
	if string(rec.Result.JSON) != `{"charge_id": "ch_1"}` && string(rec.Result.JSON) != `{"charge_id":"ch_1"}` {
		t.Fatalf("result JSON = %s", rec.Result.JSON)
	}
	got, err := s.Get(ctx, key)
	if err != nil || got.Status != idempotency.StatusCompleted {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	// A different payload with the same key is reported with the stored fingerprint.
	rec = mustClaim(t, s, claim(key, "fp2"), idempotency.Completed)
	if rec.Fingerprint != "fp1" {
		t.Fatalf("conflicting claim saw fingerprint %q, want fp1", rec.Fingerprint)
	}
}

func testReleaseFreesKey(t *testing.T, s idempotency.Store) {
	key := "k:" + token()
	a := claim(key, "fp")
	mustClaim(t, s, a, idempotency.Acquired)
	if err := s.Release(ctxT(t), a); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := s.Get(ctxT(t), key); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Get after release: %v, want ErrNotFound", err)
	}
	mustClaim(t, s, claim(key, "fp"), idempotency.Acquired)
}

func testFencedByOwner(t *testing.T, s idempotency.Store) {
	ctx := ctxT(t)
	key := "k:" + token()
	a := claim(key, "fp")
	mustClaim(t, s, a, idempotency.Acquired)
	other := a
	other.Owner = token()
	if err := s.Complete(ctx, other, idempotency.Result{}); !errors.Is(err, idempotency.ErrClaimLost) {
		t.Fatalf("Complete by a stranger: %v, want ErrClaimLost", err)
	}
	if err := s.Release(ctx, other); !errors.Is(err, idempotency.ErrClaimLost) {
		t.Fatalf("Release by a stranger: %v, want ErrClaimLost", err)
	}
	if err := s.Extend(ctx, other, time.Minute); !errors.Is(err, idempotency.ErrClaimLost) {
		t.Fatalf("Extend by a stranger: %v, want ErrClaimLost", err)
	}
	if err := s.Complete(ctx, a, idempotency.Result{}); err != nil {
		t.Fatalf("Complete by the owner: %v", err)
	}
	if err := s.Release(ctx, a); !errors.Is(err, idempotency.ErrClaimLost) {
		t.Fatalf("Release after Complete: %v, want ErrClaimLost", err)
	}
}

// testCompleteRepeatedByOwner: a Complete repeated by its owner (the guard's
// retry after the first one's answer was lost) succeeds; anyone else's still
// reports ErrClaimLost, and the stored result is the first one's.
func testCompleteRepeatedByOwner(t *testing.T, s idempotency.Store) {
	ctx := ctxT(t)
	key := "k:" + token()
	a := claim(key, "fp")
	mustClaim(t, s, a, idempotency.Acquired)
	if err := s.Complete(ctx, a, idempotency.Result{ResourceID: "first"}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if err := s.Complete(ctx, a, idempotency.Result{ResourceID: "again"}); err != nil {
		t.Fatalf("Complete repeated by its owner: %v, want nil", err)
	}
	other := a
	other.Owner = token()
	if err := s.Complete(ctx, other, idempotency.Result{}); !errors.Is(err, idempotency.ErrClaimLost) {
		t.Fatalf("Complete of a completed key by a stranger: %v, want ErrClaimLost", err)
	}
	rec, err := s.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != idempotency.StatusCompleted || rec.Result.ResourceID != "first" {
		t.Fatalf("after the repeated Complete: status %q, resource %q; want completed, first", rec.Status, rec.Result.ResourceID)
	}
}

// testRecordsAreCopies: a Record that Claim, Begin or Get returns is the
// caller's own: changing its result's JSON does not change the stored result
// that later duplicates are answered with.
func testRecordsAreCopies(t *testing.T, s idempotency.Store) {
	ctx := ctxT(t)
	key := "k:" + token()
	a := claim(key, "fp")
	mustClaim(t, s, a, idempotency.Acquired)
	if err := s.Complete(ctx, a, idempotency.Result{JSON: []byte(`[1]`)}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	scribble := func(from string, rec *idempotency.Record) {
		t.Helper()
		if rec == nil || string(rec.Result.JSON) != `[1]` {
			t.Fatalf("%s: record %+v, want the result [1]", from, rec)
		}
		rec.Result.JSON[1] = '2'
		got, err := s.Get(ctx, key)
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if string(got.Result.JSON) != `[1]` {
			t.Fatalf("stored result after changing the record %s returned = %s, want [1]", from, got.Result.JSON)
		}
	}
	scribble("Claim", mustClaim(t, s, claim(key, "fp"), idempotency.Completed))
	rec, err := s.Get(ctx, key)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	scribble("Get", rec)
	if ts, ok := s.(idempotency.TxStore); ok {
		tx, out, rec, err := ts.Begin(ctx, claim(key, "fp"))
		if tx != nil {
			_ = tx.Rollback(ctx)
		}
		if err != nil || out != idempotency.Completed {
			t.Fatalf("Begin of a completed key = %v, %v; want completed", out, err)
		}
		scribble("Begin", rec)
	}
}

// waitExpired sleeps past a claim's lease. It asserts nothing about time.
func waitExpired(lease time.Duration) { time.Sleep(lease + 150*time.Millisecond) }

func testTakeoverOnce(t *testing.T, s idempotency.Store) {
	ctx := ctxT(t)
	key := "k:" + token()
	dead := claim(key, "fp")
	dead.Lease = 200 * time.Millisecond
	mustClaim(t, s, dead, idempotency.Acquired)
	waitExpired(dead.Lease)

	const workers = 8
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		outcomes = map[idempotency.Outcome]int{}
		winner   idempotency.Claim
	)
	start := make(chan struct{})
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := claim(key, "fp")
			<-start
			out, _, err := s.Claim(ctx, c)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("Claim: %v", err)
				return
			}
			outcomes[out]++
			if out == idempotency.TakenOver {
				winner = c
			}
		}()
	}
	close(start)
	wg.Wait()
	if outcomes[idempotency.TakenOver] != 1 || outcomes[idempotency.InProgress] != workers-1 {
		t.Fatalf("outcomes of %d competing claims = %v, want 1 taken_over and %d in_progress", workers, outcomes, workers-1)
	}
	if err := s.Complete(ctx, dead, idempotency.Result{}); !errors.Is(err, idempotency.ErrClaimLost) {
		t.Fatalf("Complete by the expired owner: %v, want ErrClaimLost", err)
	}
	if err := s.Complete(ctx, winner, idempotency.Result{ResourceID: "r"}); err != nil {
		t.Fatalf("Complete by the new owner: %v", err)
	}
	rec, err := s.Get(ctx, key)
	if err != nil || rec.Takeovers != 1 || rec.Status != idempotency.StatusCompleted {
		t.Fatalf("record = %+v, %v; want completed with 1 takeover", rec, err)
	}
}

func testNoTakeoverOtherFingerprint(t *testing.T, s idempotency.Store) {
	key := "k:" + token()
	dead := claim(key, "fp1")
	dead.Lease = 100 * time.Millisecond
	mustClaim(t, s, dead, idempotency.Acquired)
	waitExpired(dead.Lease)
	rec := mustClaim(t, s, claim(key, "fp2"), idempotency.InProgress)
	if rec.Fingerprint != "fp1" {
		t.Fatalf("record fingerprint = %q, want fp1", rec.Fingerprint)
	}
}

func testExtendKeepsClaim(t *testing.T, s idempotency.Store) {
	key := "k:" + token()
	a := claim(key, "fp")
	a.Lease = 100 * time.Millisecond
	mustClaim(t, s, a, idempotency.Acquired)
	if err := s.Extend(ctxT(t), a, time.Minute); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	waitExpired(a.Lease)
	mustClaim(t, s, claim(key, "fp"), idempotency.InProgress)
}

// testLockedFor: the Record of an in-progress claim reports the time the
// claim has left by the store's clock (at most its lease, and following an
// Extend), which the guard trusts over LockedUntil and the worker's clock.
// Skipped, with the reason, for a store that does not report it (zero).
func testLockedFor(t *testing.T, s idempotency.Store) {
	ctx := ctxT(t)
	key := "k:" + token()
	a := claim(key, "fp") // a one-minute lease
	mustClaim(t, s, a, idempotency.Acquired)
	rec := mustClaim(t, s, claim(key, "fp"), idempotency.InProgress)
	if rec.LockedFor == 0 {
		t.Skipf("unsupported: %T does not report Record.LockedFor", s)
	}
	if rec.LockedFor <= 0 || rec.LockedFor > a.Lease {
		t.Fatalf("LockedFor of a fresh %s claim = %s, want within (0, %s]", a.Lease, rec.LockedFor, a.Lease)
	}
	const longer = 10 * time.Minute
	if err := s.Extend(ctx, a, longer); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	got, err := s.Get(ctx, key)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if got.LockedFor <= a.Lease || got.LockedFor > longer {
		t.Fatalf("LockedFor after Extend(%s) = %s, want within (%s, %s]", longer, got.LockedFor, a.Lease, longer)
	}
	if err := s.Complete(ctx, a, idempotency.Result{}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if got, err = s.Get(ctx, key); err != nil {
		t.Fatalf("Get: %v", err)
	}
	if got.LockedFor != 0 {
		t.Fatalf("LockedFor of a completed record = %s, want 0", got.LockedFor)
	}
}

func testGetUnknown(t *testing.T, s idempotency.Store) {
	if _, err := s.Get(ctxT(t), "k:"+token()); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Get(unknown) = %v, want ErrNotFound", err)
	}
}

func testDeleteExpiredBounded(t *testing.T, s idempotency.Store) {
	ctx := ctxT(t)
	prefix := "k:" + token() + ":"
	var expired []string
	for i := range 5 {
		c := claim(prefix+string(rune('a'+i)), "fp")
		c.Retention = 10 * time.Millisecond
		mustClaim(t, s, c, idempotency.Acquired)
		if err := s.Complete(ctx, c, idempotency.Result{}); err != nil {
			t.Fatal(err)
		}
		expired = append(expired, c.Key)
	}
	kept := claim(prefix+"kept", "fp")
	mustClaim(t, s, kept, idempotency.Acquired)
	if err := s.Complete(ctx, kept, idempotency.Result{}); err != nil {
		t.Fatal(err)
	}
	// A live claim survives its retention: claimed with a short lease, then
	// extended (a heartbeat) past the retention deadline set at the claim.
	live := claim(prefix+"live", "fp")
	live.Lease, live.Retention = 10*time.Millisecond, 10*time.Millisecond
	mustClaim(t, s, live, idempotency.Acquired)
	if err := s.Extend(ctx, live, time.Minute); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)

	// Other tests may share the table; count only what happens to our keys.
	n, err := s.DeleteExpired(ctx, 2)
	if err != nil || n > 2 || n == 0 {
		t.Fatalf("DeleteExpired(2) = %d, %v; want 1..2 rows", n, err)
	}
	if _, err := idempotency.PurgeExpired(ctx, s, 2); err != nil {
		t.Fatalf("PurgeExpired: %v", err)
	}
	for _, k := range expired {
		if _, err := s.Get(ctx, k); !errors.Is(err, idempotency.ErrNotFound) {
			t.Errorf("expired key %s still there (%v)", k, err)
		}
	}
	for _, k := range []string{kept.Key, live.Key} {
		if _, err := s.Get(ctx, k); err != nil {
			t.Errorf("key %s was deleted: %v", k, err)
		}
	}
}

func txStore(t *testing.T, s idempotency.Store) idempotency.TxStore {
	ts, ok := s.(idempotency.TxStore)
	if !ok {
		t.Skipf("unsupported: %T is not an idempotency.TxStore", s)
	}
	return ts
}

func testTxCommit(t *testing.T, s idempotency.Store) {
	ts := txStore(t, s)
	ctx := ctxT(t)
	key := "k:" + token()
	tx, out, _, err := ts.Begin(ctx, claim(key, "fp"))
	if err != nil || out != idempotency.Acquired || tx == nil {
		t.Fatalf("Begin = %v, %v, %v", tx, out, err)
	}
	type result struct {
		out idempotency.Outcome
		rec *idempotency.Record
		err error
	}
	dup := make(chan result, 1)
	go func() {
		tx2, out, rec, err := ts.Begin(ctx, claim(key, "fp"))
		if tx2 != nil {
			_ = tx2.Rollback(ctx)
		}
		dup <- result{out, rec, err}
	}()
	time.Sleep(100 * time.Millisecond) // let the duplicate reach the key and block
	select {
	case r := <-dup:
		t.Fatalf("duplicate Begin returned %v before the holder ended", r.out)
	default:
	}
	if err := tx.Commit(ctx, idempotency.Result{ResourceType: "order", ResourceID: "o1"}); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	r := <-dup
	if r.err != nil || r.out != idempotency.Completed || r.rec.Result.ResourceID != "o1" {
		t.Fatalf("duplicate after commit = %v, %+v, %v; want completed with the result", r.out, r.rec, r.err)
	}
}

func testTxRollback(t *testing.T, s idempotency.Store) {
	ts := txStore(t, s)
	ctx := ctxT(t)
	key := "k:" + token()
	tx, out, _, err := ts.Begin(ctx, claim(key, "fp"))
	if err != nil || out != idempotency.Acquired {
		t.Fatalf("Begin = %v, %v", out, err)
	}
	dup := make(chan idempotency.Outcome, 1)
	go func() {
		tx2, out, _, err := ts.Begin(ctx, claim(key, "fp"))
		if err != nil {
			t.Errorf("duplicate Begin: %v", err)
		}
		if tx2 != nil {
			_ = tx2.Rollback(ctx)
		}
		dup <- out
	}()
	time.Sleep(50 * time.Millisecond)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatalf("Rollback: %v", err)
	}
	if out := <-dup; out != idempotency.Acquired {
		t.Fatalf("duplicate after rollback = %v, want acquired", out)
	}
	if _, err := s.Get(ctx, key); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Get after rollbacks = %v, want ErrNotFound", err)
	}
}
