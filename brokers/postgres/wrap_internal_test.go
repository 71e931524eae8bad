package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/puddle/v2"

	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// TestWrapOwnTimeoutIsUnavailable checks wrap's rule for context errors: the
// caller's own (its ctx is done) comes back as is; one while the caller's
// ctx is live — the broker's own time limit ran out — wraps
// sdk.ErrUnavailable, the context error kept in the chain.
func TestWrapOwnTimeoutIsUnavailable(t *testing.T) {
	open := make(chan struct{})
	// A cancel under a live caller may be the pool's Close cutting a
	// connect: wrap then asks the pool, open here.
	pool, err := pgxpool.New(context.Background(), integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := &Broker{closed: open, table: `"berth".jobs`, pool: pool}
	live := context.Background()
	done, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithTimeout(context.Background(), -time.Second)
	defer cancel2()
	timeout := fmt.Errorf("timeout: %w", context.DeadlineExceeded) // as pgconn reports it

	if err := b.wrap(live, "receive", timeout); !errors.Is(err, sdk.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("broker's own deadline, caller live: %v; want ErrUnavailable and DeadlineExceeded", err)
	}
	if err := b.wrap(live, "ack", context.Canceled); !errors.Is(err, sdk.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled under a live caller: %v; want ErrUnavailable and Canceled", err)
	}
	if err := b.wrap(expired, "receive", timeout); err != timeout {
		t.Errorf("caller's deadline: %v; want the error as is", err)
	}
	if err := b.wrap(done, "receive", context.Canceled); err != context.Canceled {
		t.Errorf("caller cancelled: %v; want the error as is", err)
	}
	closed := make(chan struct{})
	close(closed)
	cb := &Broker{closed: closed, table: `"berth".jobs`}
	if err := cb.wrap(live, "receive", timeout); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("closed broker: %v; want ErrClosed", err)
	}
}

// TestWrapClientErrors: only errors that say the database could not be
// reached wrap sdk.ErrUnavailable. The old retryable took every error that
// was not a *pgconn.PgError for a lost connection, so a client-side error
// (an argument pgx cannot encode, a scan failure, a transaction already
// ended) was "unavailable" and retried forever.
func TestWrapClientErrors(t *testing.T) {
	b := &Broker{closed: make(chan struct{}), table: `"berth".jobs`}
	live := context.Background()
	for _, c := range []struct {
		name        string
		err         error
		unavailable bool
	}{
		{"encode", fmt.Errorf("failed to encode args[3]: %w", errors.New("cannot find encode plan")), false},
		{"scan", &pgx.ScanArgError{ColumnIndex: 1, Err: errors.New("cannot scan NULL into *string")}, false},
		{"tx closed", pgx.ErrTxClosed, false},
		{"no rows", fmt.Errorf("read: %w", pgx.ErrNoRows), false},
		{"constraint", &pgconn.PgError{Code: "23505"}, false},
		{"server shutdown", &pgconn.PgError{Code: "57P01"}, true},
		{"serialization", &pgconn.PgError{Code: "40001"}, true},
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, true},
		{"eof", fmt.Errorf("failed to receive message: %w", io.ErrUnexpectedEOF), true},
		{"conn closed", fmt.Errorf("query: %w", pgconn.ErrConnClosed), true},
		{"pool closed", puddle.ErrClosedPool, false}, // sdk.ErrClosed: see TestClosedReportsErrClosed
	} {
		err := b.wrap(live, "op", c.err)
		if got := errors.Is(err, sdk.ErrUnavailable); got != c.unavailable || !errors.Is(err, c.err) {
			t.Errorf("%s: wrap gave %v (unavailable %v); want unavailable %v with the error in the chain", c.name, err, got, c.unavailable)
		}
	}
}
