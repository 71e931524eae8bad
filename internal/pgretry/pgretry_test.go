package pgretry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"

	"github.com/berthq/berth/internal/pgretry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConnectionLost(t *testing.T) {
	for err, want := range map[error]bool{
		nil:              false,
		context.Canceled: false,
		fmt.Errorf("x: %w", context.DeadlineExceeded): false,
		&pgconn.PgError{Code: "57P01"}:                true, // terminated by an administrator
		&pgconn.PgError{Code: "57P05"}:                true, // idle_session_timeout ended the session
		&pgconn.PgError{Code: "08006"}:                true,
		&pgconn.PgError{Code: "23505"}:                false, // a statement's own error
		&pgconn.PgError{Code: "40001"}:                false,
		fmt.Errorf("read: %w", io.ErrUnexpectedEOF):   true,
		errors.New("some other failure"):              false,
	} {
		if got := pgretry.ConnectionLost(err); got != want {
			t.Errorf("ConnectionLost(%v) = %v, want %v", err, got, want)
		}
	}
}

func TestDoIsBounded(t *testing.T) {
	ctx := context.Background()
	lost := &pgconn.PgError{Code: "57P01"}
	calls := 0
	err := pgretry.Do(ctx, func(context.Context) error { calls++; return lost })
	if !errors.Is(err, lost) || calls != pgretry.Attempts {
		t.Errorf("always lost: %v after %d calls, want it after %d", err, calls, pgretry.Attempts)
	}
	calls = 0
	err = pgretry.Do(ctx, func(context.Context) error {
		calls++
		if calls < 3 {
			return lost
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Errorf("lost twice: %v after %d calls, want nil after 3", err, calls)
	}
	calls = 0
	stmt := &pgconn.PgError{Code: "23505"}
	if err := pgretry.Do(ctx, func(context.Context) error { calls++; return stmt }); !errors.Is(err, stmt) || calls != 1 {
		t.Errorf("statement error: %v after %d calls, want it after 1", err, calls)
	}
	cctx, cancel := context.WithCancel(ctx)
	calls = 0
	err = pgretry.Do(cctx, func(context.Context) error { calls++; cancel(); return lost })
	if calls != 1 || err == nil {
		t.Errorf("cancelled: %v after %d calls, want an error after 1", err, calls)
	}
}
