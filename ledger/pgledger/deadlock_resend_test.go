package pgledger_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/ledger/pgledger"
)

// abortedOnOneConnDB runs the first SendBatch on a connection of first, in
// a transaction it rolls back, and answers it as a deadlock victim, as
// PostgreSQL aborts a batch it has run part of; later calls go to second,
// a pool of other connections, as a retry through a pool may.
type abortedOnOneConnDB struct {
	*pgxpool.Pool // second
	first         *pgxpool.Pool
	sends         atomic.Int32
}

func (d *abortedOnOneConnDB) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if d.sends.Add(1) > 1 {
		return d.Pool.SendBatch(ctx, b)
	}
	tx, err := d.first.Begin(ctx)
	if err != nil {
		panic(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	_ = tx.SendBatch(ctx, b).Close()
	return deadlockResults{}
}

// TestWriteResendsADeadlockVictimOnAnotherConnection: the batch of a Write
// that PostgreSQL aborted as a deadlock victim is sent again; a pool may
// send it on another connection, which has not prepared its statements.
// Sent again as it was, the batch named the statements the first
// connection had prepared, and the retry failed ("prepared statement ...
// does not exist"), losing every event of it.
func TestWriteResendsADeadlockVictimOnAnotherConnection(t *testing.T) {
	ctx, pool, schema := testSchema(t)
	second, err := pgxpool.New(ctx, integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(second.Close)
	s, err := pgledger.New(pool, pgledger.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	db := &abortedOnOneConnDB{Pool: second, first: pool}
	if s, err = pgledger.New(db, pgledger.Options{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	at := time.Now().UTC().Truncate(time.Millisecond)
	evs := []ledger.Event{
		{MessageID: "m1", Queue: "q", Status: ledger.StatusSucceeded, Attempt: 1, At: at},
		{MessageID: "m2", Queue: "q", Status: ledger.StatusRedriven, At: at},
	}
	if err := s.Write(ctx, evs); err != nil {
		t.Fatalf("Write resent after a deadlock: %v", err)
	}
	if n := db.sends.Load(); n != 2 {
		t.Fatalf("%d sends, want 2", n)
	}
	if j, err := s.Job(ctx, "m1"); err != nil || j.Status != ledger.StatusSucceeded {
		t.Fatalf("Job = %+v, %v; want succeeded", j, err)
	}
}
