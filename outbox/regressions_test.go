package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/sdk"
)

// addAsync adds msgs in a transaction of its own on a dedicated connection,
// from a goroutine: it returns that connection's backend pid, to watch it
// wait, and a channel that gets the outcome once the transaction committed.
func addAsync(t *testing.T, pool *pgxpool.Pool, box *outbox.Outbox, queue string, msgs ...*sdk.Message) (pid uint32, done <-chan error) {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pid = conn.Conn().PgConn().PID()
	ch := make(chan error, 1)
	go func() {
		defer conn.Release()
		ch <- func() error {
			tx, err := conn.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if err := box.Add(ctx, tx, queue, msgs...); err != nil {
				return err
			}
			return tx.Commit(ctx)
		}()
	}()
	return pid, ch
}

// waitLockedOrDone waits until the backend pid waits for an advisory lock
// (true) or done delivered its outcome (false, the outcome in *err).
func waitLockedOrDone(t *testing.T, pool *pgxpool.Pool, pid uint32, done <-chan error, err *error) bool {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case *err = <-done:
			return false
		default:
		}
		var waiting bool
		if e := pool.QueryRow(context.Background(), `SELECT coalesce(wait_event_type = 'Lock' AND wait_event = 'advisory', false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting); e != nil {
			t.Fatal(e)
		}
		if waiting {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("the second producer neither waited nor finished")
	return false
}

// Two producer transactions add rows of one ordering key; the one that added
// first commits last. The second producer waits for the first one's commit,
// so the rows are published in the order they were added.
func TestKeyOrderAcrossConcurrentProducers(t *testing.T) {
	ctx := context.Background()
	pool, box, b := setup(t)
	t1, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = t1.Rollback(ctx) }()
	if err := box.Add(ctx, t1, "q", &sdk.Message{Key: "K", Type: "first"}); err != nil {
		t.Fatal(err)
	}
	// T2: added after T1, tries to commit first.
	pid, done := addAsync(t, pool, box, "q", &sdk.Message{Key: "K", Type: "second"})
	var t2Err error
	waiting := waitLockedOrDone(t, pool, pid, done, &t2Err)
	if waiting {
		t.Log("the second producer waits for the first one's commit")
	} else if t2Err != nil {
		t.Fatal(t2Err)
	}
	if _, err := box.RelayOnce(ctx, b, outbox.RelayOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := t1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if waiting {
		select {
		case t2Err = <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the second producer did not finish after the first committed")
		}
	}
	if t2Err != nil {
		t.Fatal(t2Err)
	}
	if _, err := box.RelayOnce(ctx, b, outbox.RelayOptions{}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, "q", 10)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, d := range ds {
		order = append(order, d.Message().Type)
	}
	if len(order) != 2 || order[0] != "first" || order[1] != "second" {
		t.Fatalf("key K published as %v; want [first second] (the order they were added)", order)
	}
}

// Only producers of the same queue and key wait for each other: rows without
// a key, rows of another key and rows of the same key in another queue are
// added and committed while a transaction holding key K is open.
func TestKeyLockOnlySerialisesOneKey(t *testing.T) {
	ctx := context.Background()
	pool, box, _ := setup(t)
	t1, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = t1.Rollback(ctx) }()
	if err := box.Add(ctx, t1, "q", &sdk.Message{Key: "K"}, &sdk.Message{}); err != nil {
		t.Fatal(err)
	}
	if err := box.Add(ctx, t1, "a", &sdk.Message{Key: "bc"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		queue string
		msg   *sdk.Message
	}{
		{"q", &sdk.Message{}},
		{"q", &sdk.Message{Key: "L"}},
		{"q2", &sdk.Message{Key: "K"}},
		{"ab", &sdk.Message{Key: "c"}}, // not confused with queue "a", key "bc"
	} {
		pid, done := addAsync(t, pool, box, c.queue, c.msg)
		var err error
		if waitLockedOrDone(t, pool, pid, done, &err) {
			t.Fatalf("adding %q to queue %s waits for the transaction holding key K of queue q", c.msg.Key, c.queue)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := t1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := box.Pending(ctx); err != nil || n != 7 {
		t.Fatalf("Pending = %d, %v; want 7", n, err)
	}
}

// A publisher closed under the relay (sdk.ErrClosed, e.g. at shutdown) did
// not refuse the rows: they are postponed, never parked.
func TestClosedPublisherNeverParks(t *testing.T) {
	ctx := context.Background()
	pool, box, _ := setup(t)
	add(t, pool, box, "q", &sdk.Message{}, &sdk.Message{Key: "K"})
	closed, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_ = closed.Close()
	ap := sdk.NewAsyncPublisher(closed, sdk.AsyncOptions{})
	_ = ap.Close()
	opts := outbox.RelayOptions{Backoff: fast, MaxAttempts: 2}
	for _, pub := range []sdk.Publisher{closed, ap} {
		for range 4 {
			if _, err := box.RelayOnce(ctx, pub, opts); !errors.Is(err, sdk.ErrClosed) {
				p, _ := box.Parked(ctx, 0)
				t.Fatalf("RelayOnce = %v, want ErrClosed (%d rows parked)", err, len(p))
			}
			time.Sleep(3 * time.Millisecond)
		}
	}
	if p, _ := box.Parked(ctx, 0); len(p) != 0 {
		t.Errorf("%d rows parked while the publisher was only closed", len(p))
	}
	if pending, _ := box.Pending(ctx); pending != 2 {
		t.Errorf("Pending = %d, want 2", pending)
	}
}
