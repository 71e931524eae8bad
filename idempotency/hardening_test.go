package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/idempotency/memstore"
)

// hangingExtend is a store whose first Extend blocks until its context ends,
// as one does on a starved connection pool or a link that drops packets
// silently; later calls reach the store.
type hangingExtend struct {
	idempotency.Store
	calls atomic.Int32
}

func (s *hangingExtend) Extend(ctx context.Context, c idempotency.Claim, d time.Duration) error {
	if s.calls.Add(1) == 1 {
		<-ctx.Done()
		return ctx.Err()
	}
	return s.Store.Extend(ctx, c, d)
}

// An extension that hangs must not outlast the claim: the handler is told
// ErrClaimLost before another worker can take the key over, and Do returns
// when the handler does, not when the caller's context ends.
func TestHungExtensionCancelsHandlerBeforeTakeover(t *testing.T) {
	store := &hangingExtend{Store: memstore.New(memstore.Options{})}
	const lease = 300 * time.Millisecond
	g, err := idempotency.New(idempotency.Options{Store: store, Mode: idempotency.Lease,
		ClaimLease: lease, Heartbeat: 50 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	op := idempotency.Operation{Key: "k", JobType: "t", Fingerprint: "fp"}
	var running, overlapped atomic.Bool
	cause := make(chan error, 1)
	parent, stop := context.WithTimeout(context.Background(), 30*time.Second)
	defer stop()
	first := make(chan error, 1)
	go func() {
		_, err := g.Do(parent, op, func(ctx context.Context) error {
			running.Store(true)
			defer running.Store(false)
			<-ctx.Done() // a handler that honours its context
			cause <- context.Cause(ctx)
			return context.Cause(ctx)
		})
		first <- err
	}()
	if c := <-cause; !errors.Is(c, idempotency.ErrClaimLost) {
		t.Fatalf("handler's context cause = %v, want ErrClaimLost", c)
	}
	err1 := <-first
	if !errors.Is(err1, idempotency.ErrClaimLost) {
		t.Errorf("first Do = %v, want ErrClaimLost", err1)
	}
	if parent.Err() != nil {
		t.Errorf("first Do returned only when its caller's context ended")
	}
	// The claim runs out; a redelivery takes the key over, and runs alone.
	time.Sleep(lease)
	ran, err := g.Do(context.Background(), op, func(context.Context) error {
		overlapped.Store(running.Load())
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("redelivery: ran=%v err=%v", ran, err)
	}
	if overlapped.Load() {
		t.Error("the redelivery ran while the first handler still ran")
	}
}

// With LogKeys unset, no error the guard returns quotes the key: their text
// is logged and becomes dead-letter reasons.
func TestErrorsNameKeysByDigest(t *testing.T) {
	const key = "payment:customer-4711:invoice-2026-12"
	for _, logKeys := range []bool{false, true} {
		store := memstore.New(memstore.Options{})
		g, err := idempotency.New(idempotency.Options{Store: store, Mode: idempotency.Lease, Heartbeat: -1,
			ClaimLease: 200 * time.Millisecond, LogKeys: logKeys, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		op := idempotency.Operation{Key: key, JobType: "t", Fingerprint: "fp"}
		ctx := context.Background()
		var errs []error
		// Complete after a takeover: ErrClaimLost.
		_, err = g.Do(ctx, op, func(context.Context) error {
			time.Sleep(300 * time.Millisecond) // past the claim
			if _, err := g.Do(ctx, op, func(context.Context) error { return nil }); err != nil {
				t.Fatal(err)
			}
			return nil
		})
		if !errors.Is(err, idempotency.ErrClaimLost) {
			t.Fatalf("LogKeys %v: Do after a takeover = %v, want ErrClaimLost", logKeys, err)
		}
		errs = append(errs, err)
		// In progress elsewhere.
		op2 := idempotency.Operation{Key: key + ":2", JobType: "t", Fingerprint: "fp"}
		if _, _, err := store.Claim(ctx, idempotency.Claim{Key: op2.Key, Fingerprint: "fp", Owner: "other", Lease: time.Minute, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
		_, err = g.Do(ctx, op2, func(context.Context) error { return nil })
		if !errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("Do on a key held elsewhere = %v, want ErrInProgress", err)
		}
		errs = append(errs, err)
		// A conflict: the same key, another payload.
		op.Fingerprint = "other"
		_, err = g.Do(ctx, op, func(context.Context) error { return nil })
		if !errors.Is(err, idempotency.ErrKeyConflict) {
			t.Fatalf("Do with another payload = %v, want ErrKeyConflict", err)
		}
		errs = append(errs, err)
		for _, err := range errs {
			named := strings.Contains(err.Error(), key)
			digest := strings.Contains(err.Error(), idempotency.KeyDigest(key)) || strings.Contains(err.Error(), idempotency.KeyDigest(key+":2"))
			if named != logKeys || digest == logKeys {
				t.Errorf("LogKeys %v: error text %q: names the key %v, its digest %v", logKeys, err, named, digest)
			}
		}
	}
}

// Events from different sources never share a key, whatever their sources
// and IDs hold; a source without ':' or '%' keeps the key it always had.
func TestInboxKeysDoNotCollide(t *testing.T) {
	g, err := idempotency.New(idempotency.Options{Store: memstore.New(memstore.Options{}), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	in := g.Inbox()
	if got := in.Key(idempotency.InboxEvent{Source: "stripe", ID: "evt_1"}); got != "inbox:stripe:evt_1" {
		t.Errorf("key = %q, want the unescaped form", got)
	}
	events := []idempotency.InboxEvent{
		{Source: "shop", ID: "eu:1"},
		{Source: "shop:eu", ID: "1"},
		{Source: "shop%3Aeu", ID: "1"},
		{Source: "shop%", ID: "3Aeu:1"},
	}
	keys := map[string]idempotency.InboxEvent{}
	applied := 0
	for _, e := range events {
		e.Type, e.Payload = "order.paid", []byte(`{}`)
		k := in.Key(e)
		if prev, dup := keys[k]; dup {
			t.Errorf("events %+v and %+v share key %q", prev, e, k)
		}
		keys[k] = e
		if _, err := in.Process(context.Background(), e, func(context.Context) error { applied++; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if applied != len(events) {
		t.Errorf("%d distinct events applied %d times", len(events), applied)
	}
}

// SetResult refuses JSON that is not JSON (a store would refuse it at
// completion, leaving the claim to a redelivery that applies the effect
// again) and keeps its own copy of what it accepts.
func TestSetResultChecksJSON(t *testing.T) {
	store := memstore.New(memstore.Options{})
	g, err := idempotency.New(idempotency.Options{Store: store, Mode: idempotency.Lease, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if idempotency.SetResult(ctx, idempotency.Result{JSON: []byte(`{}`)}) {
		t.Error("SetResult outside a guard reported true")
	}
	buf := []byte(`{"charge":"ch_1"}`)
	op := idempotency.Operation{Key: "k", JobType: "t", Fingerprint: "fp"}
	if _, err := g.Do(ctx, op, func(ctx context.Context) error {
		if idempotency.SetResult(ctx, idempotency.Result{JSON: []byte("<html>ok</html>")}) {
			t.Error("SetResult accepted invalid JSON")
		}
		if !idempotency.SetResult(ctx, idempotency.Result{JSON: buf}) {
			t.Error("SetResult refused valid JSON")
		}
		copy(buf, "garbage") // the caller reuses its buffer
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	rec, err := store.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(rec.Result.JSON, []byte(`{"charge":"ch_1"}`)) {
		t.Errorf("stored result JSON = %q", rec.Result.JSON)
	}
}

// A claim lease too short to derive a heartbeat from is refused by New, not
// a panic in the heartbeat's goroutine.
func TestTinyClaimLeaseRefused(t *testing.T) {
	_, err := idempotency.New(idempotency.Options{Store: memstore.New(memstore.Options{}), Mode: idempotency.Lease, ClaimLease: 2, Logger: quiet})
	if !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("New with ClaimLease 2ns = %v, want ErrInvalidConfig", err)
	}
}
