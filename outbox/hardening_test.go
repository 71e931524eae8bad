package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
)

// fast retries failed rows at once.
var fast = sdk.Backoff{Base: time.Millisecond, Max: time.Millisecond, Jitter: -1}

func add(t *testing.T, pool *pgxpool.Pool, box *outbox.Outbox, queue string, msgs ...*sdk.Message) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := box.Add(ctx, tx, queue, msgs...); err != nil {
		_ = tx.Rollback(ctx)
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// relayUntil runs RelayOnce until cond holds (generous deadline).
func relayUntil(t *testing.T, box *outbox.Outbox, pub sdk.Publisher, opts outbox.RelayOptions, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("relay never reached: %s", what)
		}
		_, _ = box.RelayOnce(context.Background(), pub, opts)
		time.Sleep(5 * time.Millisecond)
	}
}

func attemptsOf(t *testing.T, pool *pgxpool.Pool, schema, id string) (attempts int, lastErr string) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), `SELECT attempts, last_error FROM `+pgx.Identifier{schema, "berth_outbox"}.Sanitize()+` WHERE message_id = $1`, id).
		Scan(&attempts, &lastErr); err != nil {
		t.Fatalf("row of %s: %v", id, err)
	}
	return attempts, lastErr
}

// Issue 11 item 3: one row the broker refuses fails alone; the rest of its
// queue is published; the bad row is retried on its own backoff and parked
// after MaxAttempts, listed by Parked, and can be requeued or discarded.
func TestHardening3_OutboxBadRowDoesNotBlockQueue(t *testing.T) {
	ctx := context.Background()
	pool, box, _, schema := setupSchema(t, outbox.Options{})
	b, err := memory.New(memory.Options{MaxMessageSize: 1024}) // the outbox accepts up to 256 KiB
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	good1, bad, good2 := &sdk.Message{Type: "a"}, &sdk.Message{Type: "big", Body: make([]byte, 2048)}, &sdk.Message{Type: "b"}
	add(t, pool, box, "q", good1, bad, good2)

	opts := outbox.RelayOptions{Backoff: sdk.Backoff{Base: time.Hour, Max: time.Hour}, MaxAttempts: 3}
	n, err := box.RelayOnce(ctx, b, opts)
	if n != 2 || !errors.Is(err, sdk.ErrMessageTooLarge) {
		t.Fatalf("RelayOnce = %d, %v; want the 2 good rows published and the refusal reported", n, err)
	}
	got := drain(t, b, "q", 2)
	if got[good1.ID] == nil || got[good2.ID] == nil {
		t.Fatalf("published %v, want the good rows", got)
	}
	if a, e := attemptsOf(t, pool, schema, bad.ID); a != 1 || !strings.Contains(e, "over the broker limit") {
		t.Errorf("bad row: attempts %d, last_error %q", a, e)
	}
	// Its own backoff (an hour): the next pass leaves it alone.
	if n, err := box.RelayOnce(ctx, b, opts); n != 0 || err != nil {
		t.Errorf("second pass = %d, %v; want nothing due", n, err)
	}
	if a, _ := attemptsOf(t, pool, schema, bad.ID); a != 1 {
		t.Errorf("attempts %d after a pass within its backoff, want 1", a)
	}

	// Make it due now, and retry fast from here.
	if _, err := pool.Exec(ctx, `UPDATE `+pgx.Identifier{schema, "berth_outbox"}.Sanitize()+` SET available_at = now()`); err != nil {
		t.Fatal(err)
	}
	opts.Backoff = fast
	relayUntil(t, box, b, opts, "the bad row parked", func() bool {
		p, err := box.Parked(ctx, 0)
		return err == nil && len(p) == 1
	})
	parked, _ := box.Parked(ctx, 10)
	p := parked[0]
	if p.Message.ID != bad.ID || p.Queue != "q" || p.Attempts != 3 || !strings.Contains(p.LastError, "over the broker limit") || p.ParkedAt.IsZero() {
		t.Errorf("parked row %+v", p)
	}
	if pending, _ := box.Pending(ctx); pending != 0 {
		t.Errorf("Pending = %d with only a parked row, want 0", pending)
	}
	if n, err := box.RelayOnce(ctx, b, opts); n != 0 || err != nil {
		t.Errorf("pass with only a parked row = %d, %v", n, err)
	}
	if a, _ := attemptsOf(t, pool, schema, bad.ID); a != 3 {
		t.Errorf("a parked row was tried again: attempts %d", a)
	}
	if _, err := box.Requeue(ctx, p.ID, p.ID+1000); !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("Requeue of an unknown id: %v, want ErrNotFound", err)
	}
	if n, err := box.Requeue(ctx, p.ID); n != 1 || err != nil {
		t.Fatalf("Requeue = %d, %v", n, err)
	}
	if a, _ := attemptsOf(t, pool, schema, bad.ID); a != 0 {
		t.Errorf("attempts %d after Requeue, want 0", a)
	}
	if pending, _ := box.Pending(ctx); pending != 1 {
		t.Errorf("Pending = %d after Requeue, want 1", pending)
	}
	relayUntil(t, box, b, opts, "parked again", func() bool { p, _ := box.Parked(ctx, 0); return len(p) == 1 })
	if n, err := box.Discard(ctx); n != 1 || err != nil {
		t.Fatalf("Discard = %d, %v", n, err)
	}
	if p, _ := box.Parked(ctx, 0); len(p) != 0 {
		t.Errorf("parked after Discard: %v", p)
	}
}

// Issue 11 item 3: rows of one ordering key are published in order; a
// failing or parked row holds back the later rows of its key only.
func TestHardening3_OutboxOrderingKeyBlocksOnlyItsKey(t *testing.T) {
	ctx := context.Background()
	pool, box, _ := setup(t)
	b, err := memory.New(memory.Options{MaxMessageSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	k1 := &sdk.Message{Key: "K", Type: "k1", Body: make([]byte, 2048)} // refused
	k2 := &sdk.Message{Key: "K", Type: "k2"}
	j1, j2, j3 := &sdk.Message{Key: "J", Type: "j1"}, &sdk.Message{Key: "J", Type: "j2"}, &sdk.Message{Key: "J", Type: "j3"}
	free := &sdk.Message{Type: "free"}
	add(t, pool, box, "q", k1, j1, k2, j2, free, j3)
	k3 := &sdk.Message{Key: "K", Type: "k3"}
	add(t, pool, box, "other", &sdk.Message{Key: "K", Type: "other-k"}) // same key, other queue: not held back
	add(t, pool, box, "q", k3)

	opts := outbox.RelayOptions{Backoff: fast, MaxAttempts: 2}
	n, err := box.RelayOnce(ctx, b, opts)
	if n != 5 || !errors.Is(err, sdk.ErrMessageTooLarge) {
		t.Fatalf("RelayOnce = %d, %v; want j1 j2 j3 free and the other queue's row", n, err)
	}
	var order []string
	ds, err := b.Receive(ctx, "q", 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		order = append(order, d.Message().Type)
		_ = d.Ack(ctx)
	}
	if j := strings.Join(order, ","); !strings.Contains(j, "j1,j2") || strings.Index(j, "j2") > strings.Index(j, "j3") || strings.Contains(j, "k") || len(order) != 4 {
		t.Errorf("published %v; want j1, j2, j3 in order and free, and nothing of key K", order)
	}
	drain(t, b, "other", 1)
	relayUntil(t, box, b, opts, "k1 parked", func() bool { p, _ := box.Parked(ctx, 0); return len(p) == 1 })
	for range 3 { // parked k1 still holds back k2 and k3
		if n, err := box.RelayOnce(ctx, b, opts); n != 0 || err != nil {
			t.Fatalf("pass behind a parked row = %d, %v; want nothing", n, err)
		}
	}
	if pending, _ := box.Pending(ctx); pending != 2 {
		t.Errorf("Pending = %d, want k2 and k3", pending)
	}
	if n, err := box.Discard(ctx); n != 1 || err != nil {
		t.Fatal(n, err)
	}
	if n, err := box.RelayOnce(ctx, b, opts); n != 2 || err != nil {
		t.Fatalf("after discarding k1: %d, %v; want k2 and k3", n, err)
	}
	ds, err = b.Receive(ctx, "q", 10)
	if err != nil || len(ds) != 2 || ds[0].Message().Type != "k2" || ds[1].Message().Type != "k3" {
		t.Fatalf("got %d deliveries (%v), want k2 then k3", len(ds), err)
	}
}

// A broker that is down postpones rows but never parks them.
func TestHardening3_OutboxUnavailableNeverParks(t *testing.T) {
	ctx := context.Background()
	pool, box, b := setup(t)
	add(t, pool, box, "q", &sdk.Message{}, &sdk.Message{})
	pub := &failing{Publisher: b, left: 1000}
	opts := outbox.RelayOptions{Backoff: fast, MaxAttempts: 2}
	for range 5 {
		if _, err := box.RelayOnce(ctx, pub, opts); !errors.Is(err, sdk.ErrUnavailable) {
			t.Fatalf("RelayOnce = %v, want ErrUnavailable", err)
		}
		time.Sleep(3 * time.Millisecond)
	}
	if p, _ := box.Parked(ctx, 0); len(p) != 0 {
		t.Errorf("%d rows parked while the broker was only down", len(p))
	}
	if pending, _ := box.Pending(ctx); pending != 2 {
		t.Errorf("Pending = %d, want 2", pending)
	}
}

// Issue 11 item 3: eight processes starting together all migrate.
func TestHardening3_OutboxConcurrentMigrate(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for round := range 3 {
		schema := fmt.Sprintf("outbox_migrate_%d", rand.Uint64()%1e12)
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			box, err := outbox.New(pool, outbox.Options{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- box.Migrate(ctx)
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("round %d: concurrent Migrate: %v", round, err)
			}
		}
		_, _ = pool.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	}
}

// Issue 11 item 3: relays running side by side keep each ordering key's
// order: a row is never published while an earlier row of its key is held by
// another relay.
func TestHardening3_OutboxConcurrentRelaysKeepKeyOrder(t *testing.T) {
	ctx := context.Background()
	pool, box, b := setup(t)
	const keys, perKey = 5, 40
	for i := range perKey {
		var msgs []*sdk.Message
		for k := range keys {
			msgs = append(msgs, &sdk.Message{Key: fmt.Sprint("k", k), Body: []byte(fmt.Sprint(i))})
		}
		add(t, pool, box, "q", msgs...)
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = box.Relay(rctx, b, outbox.RelayOptions{BatchSize: 7, PollInterval: 2 * time.Millisecond})
		}()
	}
	next := map[string]int{}
	dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
	defer dcancel()
	for got := 0; got < keys*perKey; {
		ds, err := b.Receive(dctx, "q", 100)
		if err != nil {
			t.Fatalf("received %d of %d: %v", got, keys*perKey, err)
		}
		for _, d := range ds {
			m := d.Message()
			if want := fmt.Sprint(next[m.Key]); string(m.Body) != want {
				t.Errorf("key %s: got row %s, want %s", m.Key, m.Body, want)
			}
			next[m.Key]++
			got++
			_ = d.Ack(ctx)
		}
	}
	cancel()
	wg.Wait()
}
