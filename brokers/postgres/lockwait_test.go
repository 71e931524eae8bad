package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// TestLockTimeoutIsUnavailable: a session with a lock_timeout (a common
// server or role setting) whose Publish waited behind another's lock on
// the jobs table (a migration's DDL, an operator's LOCK TABLE) failed with
// 55P03, which the broker classed as the statement's own error: callers,
// AsyncPool and the outbox took it for a refusal of the message (the relay
// counted it toward MaxAttempts and parked the row) rather than a busy
// database to try again. It wraps sdk.ErrUnavailable now.
func TestLockTimeoutIsUnavailable(t *testing.T) {
	pool := newPool(t, "berth-lockwait-"+suffix(), 2)
	b := newBroker(t, pool, postgres.Options{DisableListen: true})
	ctx := testCtx(t)
	if err := b.Publish(ctx, "lockwait", &sdk.Message{Body: []byte("warm")}); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `LOCK TABLE `+pgx.Identifier{b.Schema(), "jobs"}.Sanitize()+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}

	waiting := newPoolWith(t, "berth-lockwait-other", 2, map[string]string{"lock_timeout": "200ms"})
	other, err := postgres.New(waiting, postgres.Options{Schema: b.Schema(), DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	err = other.Publish(ctx, "lockwait", &sdk.Message{Body: []byte("x")})
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "55P03" {
		t.Fatalf("Publish behind a table lock with lock_timeout 200ms = %v, want PostgreSQL's 55P03 in the chain", err)
	}
	if !errors.Is(err, sdk.ErrUnavailable) {
		t.Errorf("Publish that timed out waiting for a lock = %v, want an error wrapping sdk.ErrUnavailable (try again later)", err)
	}
}
