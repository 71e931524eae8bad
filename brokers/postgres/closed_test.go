package postgres_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// closedOp is one public operation of the broker or of a delivery, for
// TestClosedReportsErrClosed.
type closedOp struct {
	name string
	run  func(ctx context.Context) error
}

// closedOps lists every public operation that touches the database: the
// broker's, and each settlement of its own delivery from ds (at least 6).
func closedOps(b *postgres.Broker, q string, ds []sdk.Delivery) []closedOp {
	return []closedOp{
		{"Publish", func(ctx context.Context) error {
			return b.Publish(ctx, q, &sdk.Message{Type: "t", Body: []byte("x")})
		}},
		{"Receive", func(ctx context.Context) error { _, err := b.Receive(ctx, q, 1); return err }},
		{"Migrate", b.Migrate},
		{"DeclareQueue", func(ctx context.Context) error { return b.DeclareQueue(ctx, q) }},
		{"Stats", func(ctx context.Context) error { _, err := b.Stats(ctx, q); return err }},
		{"CountByStatus", func(ctx context.Context) error { _, err := b.CountByStatus(ctx, q); return err }},
		{"Queues", func(ctx context.Context) error { _, err := b.Queues(ctx); return err }},
		{"ListDeadLetters", func(ctx context.Context) error { _, err := b.ListDeadLetters(ctx, q, 10); return err }},
		{"GetDeadLetter", func(ctx context.Context) error { _, err := b.GetDeadLetter(ctx, q, "some-id"); return err }},
		{"DeadLetterPage", func(ctx context.Context) error { _, _, err := b.DeadLetterPage(ctx, q, "", 10); return err }},
		{"DeadLetterMark", func(ctx context.Context) error { _, err := b.DeadLetterMark(ctx, q); return err }},
		{"DeadLetterPageTo", func(ctx context.Context) error {
			_, _, err := b.DeadLetterPageTo(ctx, q, "", "1-1", 10)
			return err
		}},
		{"RedriveDeadLetters", func(ctx context.Context) error { _, err := b.RedriveDeadLetters(ctx, q); return err }},
		{"DeleteDeadLetters", func(ctx context.Context) error { _, err := b.DeleteDeadLetters(ctx, q, "some-id"); return err }},
		{"PurgeDeadLetters", func(ctx context.Context) error { _, err := b.PurgeDeadLetters(ctx, q); return err }},
		{"DeleteCompleted", func(ctx context.Context) error { _, err := b.DeleteCompleted(ctx, time.Hour, 10); return err }},
		{"Ack", ds[0].Ack},
		{"AckAsync", func(ctx context.Context) error {
			ch := make(chan error, 1)
			ds[1].(sdk.AsyncAcker).AckAsync(ctx, func(err error) { ch <- err })
			return <-ch
		}},
		{"Retry", func(ctx context.Context) error { return ds[2].Retry(ctx, 0, errors.New("boom")) }},
		{"Release", func(ctx context.Context) error { return ds[3].(sdk.Releaser).Release(ctx, 0) }},
		{"DeadLetter", func(ctx context.Context) error { return ds[4].DeadLetter(ctx, errors.New("boom")) }},
		{"ExtendLease", func(ctx context.Context) error {
			return ds[5].(interface {
				ExtendLease(context.Context, time.Duration) error
			}).ExtendLease(ctx, time.Minute)
		}},
	}
}

// TestClosedReportsErrClosed: once the broker is closed, or the pool it was
// given is closed by the application, every operation reports
// sdk.ErrClosed, not sdk.ErrUnavailable: nothing will come from a closed
// pool again, and a caller told "unavailable" (the Worker among them)
// retries for ever instead of stopping.
func TestClosedReportsErrClosed(t *testing.T) {
	for _, how := range []string{"broker closed", "pool closed"} {
		t.Run(how, func(t *testing.T) {
			pool := newPool(t, "berth-closed-"+suffix(), 4)
			// PublishTx runs in the caller's transaction, from a pool of
			// its own: it is refused after Close only. That pool also
			// drops the schema: pool may be closed by then.
			other := newPool(t, "berth-closed-tx-"+suffix(), 2)
			b := newBroker(t, pool, postgres.Options{Schema: freshSchema(t, other), DisableListen: true,
				PollInterval: 20 * time.Millisecond})
			q := "closed"
			publishN(t, b, q, 6)
			ds := receiveN(t, b, q, 6)
			tx, err := other.Begin(testCtx(t))
			if err != nil {
				t.Fatalf("Begin: %v", err)
			}
			defer func() { _ = tx.Rollback(context.Background()) }()
			ops := closedOps(b, q, ds)
			if how == "broker closed" {
				_ = b.Close()
				ops = append(ops, closedOp{"PublishTx", func(ctx context.Context) error {
					return b.PublishTx(ctx, tx, q, &sdk.Message{Type: "t", Body: []byte("x")})
				}})
			} else {
				pool.Close()
			}
			for _, op := range ops {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := op.run(ctx)
				cancel()
				if !errors.Is(err, sdk.ErrClosed) || errors.Is(err, sdk.ErrUnavailable) {
					t.Errorf("%s with the %s = %v; want an error wrapping sdk.ErrClosed (and not ErrUnavailable)", op.name, how, err)
				}
			}
		})
	}
}

// TestClosedPoolCutsConnectHook: a Publish whose connect runs the
// application's AfterConnect hook (types loaded, a role set: a statement)
// when the application closes the pool reports sdk.ErrClosed, not
// sdk.ErrUnavailable. The pool's Close cancels the hook's context, and the
// hook's error is its own, not a *pgconn.ConnectError. Before, only the
// latter counted as a connect cut by Close, so the call said "no answer
// within the broker's time limit" and its caller (a Worker) retried.
func TestClosedPoolCutsConnectHook(t *testing.T) {
	cfg, err := pgxpool.ParseConfig(integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	var armed atomic.Bool
	started := make(chan struct{})
	var once sync.Once
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if !armed.Load() {
			return nil
		}
		once.Do(func() { close(started) })
		_, err := conn.Exec(ctx, "SELECT pg_sleep(60)")
		return err
	}
	ctx := testCtx(t)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	admin := newPool(t, "berth-closed-hook-admin-"+suffix(), 2)
	b := newBroker(t, pool, postgres.Options{Schema: freshSchema(t, admin), DisableListen: true})
	pool.Reset() // the next call connects
	armed.Store(true)
	got := make(chan error, 1)
	go func() { got <- b.Publish(ctx, "q", &sdk.Message{Type: "t", Body: []byte("x")}) }()
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("Publish did not connect")
	}
	pool.Close() // cuts the hook with a cancel
	err = <-got
	if !errors.Is(err, sdk.ErrClosed) || errors.Is(err, sdk.ErrUnavailable) {
		t.Fatalf("Publish whose connect hook the pool's Close cut: %v; want sdk.ErrClosed, not sdk.ErrUnavailable", err)
	}
}

// TestClosedPoolCutsMultiHostConnect: a Publish whose connect goes through
// the hosts of a multi-host connection string (a primary and a standby),
// the first of which has run out of its connect_timeout, reports
// sdk.ErrClosed, not sdk.ErrUnavailable, when the application closes the
// pool during the connect to the next. pgx joins the error of each host,
// a deadline and the cancel of Close. Before, the deadline ruled out the
// probe of the pool, so the call said "no answer within the broker's time
// limit" and its caller (a Worker) retried. The hosts are silent servers
// (they accept and never answer), as hosts cut off by the network are.
func TestClosedPoolCutsMultiHostConnect(t *testing.T) {
	hosts, dial, dialedSecond := integration.TwoSilentHosts(t)
	cfg, err := pgxpool.ParseConfig("postgres://postgres@" + hosts + "/test?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.ConnectTimeout = time.Second // each host's own limit
	cfg.ConnConfig.DialFunc = dial
	ctx := testCtx(t)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b, err := postgres.New(pool, postgres.Options{DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	got := make(chan error, 1)
	go func() { got <- b.Publish(ctx, "q", &sdk.Message{Type: "t", Body: []byte("x")}) }()
	select {
	case <-dialedSecond: // the first host timed out; the second waits for its reply
	case <-ctx.Done():
		t.Fatal("Publish never tried the second host")
	}
	pool.Close() // cuts the connect to the second host with a cancel
	err = <-got
	if !errors.Is(err, sdk.ErrClosed) || errors.Is(err, sdk.ErrUnavailable) {
		t.Fatalf("Publish whose multi-host connect the pool's Close cut: %v; want sdk.ErrClosed, not sdk.ErrUnavailable", err)
	}
}
