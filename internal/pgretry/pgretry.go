// Package pgretry repeats a PostgreSQL call that is safe to repeat when the
// connection it ran on was lost: a BEGIN, or a statement whose second run has
// the same effect as the first (berth's fenced ack). It is the one retry loop
// berth's PostgreSQL code uses for such calls.
//
// Why a loop at all: after pg_terminate_backend, a server restart or a
// network cut, a connection pool still holds the dead connections, and hands
// them out until each has been used once (pgxpool pings only connections
// idle for more than a second). A call that fails that way says nothing
// about the database, only about that connection; one more try takes
// another connection.
package pgretry

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Attempts bounds the tries of one call: enough to get past the dead
// connections of a typical pool after all its backends were terminated.
const Attempts = 6

// waits are the pauses before the 2nd, 3rd, ... try (about 0.4s in all).
var waits = [Attempts - 1]time.Duration{0, 10 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond}

// Do runs f until it succeeds, returns an error that is not a lost
// connection ([ConnectionLost]), ctx is done, or it failed [Attempts] times;
// it returns f's last error (or ctx's error, when ctx ended a wait). Use it
// only for calls that are safe to repeat after a failure whose outcome is
// unknown.
func Do(ctx context.Context, f func(ctx context.Context) error) error {
	var err error
	for i := range Attempts {
		if i > 0 {
			if err := sleep(ctx, waits[i-1]); err != nil {
				return err
			}
		}
		err = f(ctx)
		if err == nil || !ConnectionLost(err) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// ConnectionLost reports whether err says that the connection failed, not
// the statement: the server closed it (SQLSTATE class 08, 57P01-57P03:
// administrator command, crash shutdown, cannot connect now, or 57P05: the
// session sat idle past idle_session_timeout, which the client reads only
// with the reply to its next statement), or the client could not read or
// write it. Context errors and every other server error are not.
func ConnectionLost(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08") || pgErr.Code == "57P01" || pgErr.Code == "57P02" || pgErr.Code == "57P03" ||
			pgErr.Code == "57P05"
	}
	if pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	// A closed or broken connection surfaces without a server error: pgconn
	// reports it with one of its connection-level error types (all have a
	// SafeToRetry method, whatever it answers: "conn closed", a failed read
	// or write), or as an I/O error (unexpected EOF, reset, broken pipe).
	var connErr interface{ SafeToRetry() bool }
	return errors.As(err, &connErr) || isIO(err)
}

func isIO(err error) bool {
	var netErr net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.As(err, &netErr)
}
