package pgledger_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/ledger/pgledger"
)

// deadlockDB is a pool whose first failures SendBatch calls are aborted as
// a deadlock victim (40P01) before reaching the server, as PostgreSQL aborts
// one of two batches that lock each other's rows: a failure a real server
// gives only under a race no test can time.
type deadlockDB struct {
	*pgxpool.Pool
	failures int32
	sends    atomic.Int32
}

func (d *deadlockDB) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if d.sends.Add(1) <= d.failures {
		return deadlockResults{}
	}
	return d.Pool.SendBatch(ctx, b)
}

// deadlockResults answers as a batch aborted by a deadlock; the methods it
// does not override are never called.
type deadlockResults struct{ pgx.BatchResults }

var errDeadlock = &pgconn.PgError{Code: "40P01", Message: "deadlock detected"}

func (deadlockResults) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, errDeadlock }
func (deadlockResults) Query() (pgx.Rows, error)         { return nil, errDeadlock }
func (deadlockResults) QueryRow() pgx.Row                { return nil }
func (deadlockResults) Close() error                     { return errDeadlock }

// TestWriteRetriesADeadlockVictim: a batch PostgreSQL aborted as a deadlock
// victim (two writers each upserting the job the other's batch redrives or
// dead-letters) is rolled back whole; Write sends it again instead of
// losing every event of it. A batch that keeps failing so fails after a
// few tries.
func TestWriteRetriesADeadlockVictim(t *testing.T) {
	ctx, pool, schema := testSchema(t)
	at := time.Now().UTC().Truncate(time.Millisecond)
	ev := ledger.Event{MessageID: "m1", Queue: "q", Status: ledger.StatusSucceeded, Attempt: 1, At: at}

	db := &deadlockDB{Pool: pool, failures: 1}
	s, err := pgledger.New(db, pgledger.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, []ledger.Event{ev}); err != nil {
		t.Fatalf("Write after one deadlock: %v", err)
	}
	if j, err := s.Job(ctx, "m1"); err != nil || j.Status != ledger.StatusSucceeded {
		t.Fatalf("Job = %+v, %v; want succeeded", j, err)
	}

	db = &deadlockDB{Pool: pool, failures: 1 << 20}
	s, err = pgledger.New(db, pgledger.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Write(ctx, []ledger.Event{{MessageID: "m2", Queue: "q", Status: ledger.StatusRunning, Attempt: 1, At: at}})
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "40P01" {
		t.Fatalf("Write under endless deadlocks = %v, want the deadlock error", err)
	}
	if n := db.sends.Load(); n < 2 || n > 5 {
		t.Fatalf("%d sends under endless deadlocks, want a few", n)
	}
}
