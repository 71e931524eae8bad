package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"

	"github.com/berthq/berth/internal/pgretry"
	"github.com/berthq/berth/internal/sqlident"
	"github.com/berthq/berth/sdk"
)

// wrap turns a database error into the broker's. ctx is the caller's
// context (context.Background() where no caller waits on the statement, as
// for the acker's flush). A context error is returned unwrapped when ctx is
// done: the caller cancelled or ran out of time. When ctx is still live, the
// limit that ran out was the broker's own (a claim's or a flush's time
// bound, see Broker.claimTimeout and Broker.ackTimeout): the database did
// not answer in time, which is an error wrapping [sdk.ErrUnavailable] (the
// context error stays in the chain), unless it is the pool's Close cutting
// a connect under way, or the application's connect hook (see
// pgretry.ConnectCut). Otherwise a closed broker's error, and that of a
// pool the application closed, becomes [sdk.ErrClosed]; a
// missing job table (Migrate never ran) one wrapping [sdk.ErrNotFound];
// connection failures, server shutdowns,
// serialization failures and deadlocks errors wrapping [sdk.ErrUnavailable]
// (the call may be retried, see retryable); anything else, server or client
// error, is wrapped as is. The text never carries the connection string.
func (b *Broker) wrap(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	ctxErr := errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
	if ctxErr && ctx.Err() != nil {
		return err
	}
	if b.isClosed() {
		return errClosed(op)
	}
	if errors.Is(err, puddle.ErrClosedPool) || (ctxErr && pgretry.ConnectCut(err) && b.poolClosed()) {
		// The application closed the pool: nothing will come from it
		// again, so retrying (what ErrUnavailable asks for) is pointless.
		// A connect under way when it did is cut with a cancelled
		// context, which is not the broker's time limit running out.
		return fmt.Errorf("berth/postgres: %s: %w: %w", op, sdk.ErrClosed, err)
	}
	if ctxErr {
		return fmt.Errorf("berth/postgres: %s: %w: no answer within the broker's time limit: %w", op, sdk.ErrUnavailable, err)
	}
	if missingTable(err) {
		return fmt.Errorf("berth/postgres: %s: %w: no job table %s (run Migrate): %w", op, sdk.ErrNotFound, b.table, err)
	}
	if retryable(err) {
		return fmt.Errorf("berth/postgres: %s: %w: %w", op, sdk.ErrUnavailable, err)
	}
	return fmt.Errorf("berth/postgres: %s: %w", op, err)
}

// poolClosed reports whether the application has closed the pool (see
// pgretry.PoolClosed): asked only for an error that a closed pool explains
// (a connect cut by a cancel) and by the listener's watcher.
func (b *Broker) poolClosed() bool { return pgretry.PoolClosed(b.pool) }

// retryable reports whether err is worth retrying later: a broken or refused
// connection, a server going away or short of resources, a deadlock or
// serialization failure, a lock or statement timeout (the table locked by
// a migration's DDL, a server under load). A read-only transaction (25006)
// is not: it is as often a role's setting, which no retry changes, as a
// failover's demoted primary.
// Another server error (a constraint, a bad value) is the statement's, and
// so is a client-side error that is not about the connection: an argument
// pgx cannot encode, a transaction already ended (PublishTx), a row that
// does not scan. Retrying those gives the same error forever.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), // connection exception
			strings.HasPrefix(pgErr.Code, "57P"), // admin shutdown, crash shutdown, cannot connect now, idle session timeout
			strings.HasPrefix(pgErr.Code, "53"),  // insufficient resources: too many connections, disk full, out of memory
			pgErr.Code == "55P03",                // lock_not_available: a lock_timeout ran out behind another's lock (DDL)
			pgErr.Code == "57014",                // query_canceled by the server: a statement_timeout under load
			pgErr.Code == "40001",                // serialization failure
			pgErr.Code == "40P01":                // deadlock detected
			return true
		}
		return false
	}
	return connectionLost(err)
}

// connectionLost reports whether err, not a server error, says the database
// could not be reached or the connection failed under the statement: what
// [pgretry.ConnectionLost] reports (a network error or timeout, the server
// closing the socket, a connection pgx has closed) or a failed connect. A
// pool closed by the application is not lost but closed: wrap reports it as
// [sdk.ErrClosed].
func connectionLost(err error) bool {
	var connectErr *pgconn.ConnectError
	return pgretry.ConnectionLost(err) || errors.Is(err, pgconn.ErrConnClosed) || errors.As(err, &connectErr)
}

// missingTable reports whether err says the job table or its schema does
// not exist: Migrate never ran there, so no queue of the broker exists.
func missingTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000") // undefined_table, invalid_schema_name
}

// unstorableID returns the first of ids that a text column cannot hold (a
// NUL or invalid UTF-8): no stored message has it, since Publish refuses
// it, and a query with it fails instead of finding nothing.
func unstorableID(ids ...string) (string, bool) {
	for _, id := range ids {
		if !sqlident.StorableText(id) {
			return id, true
		}
	}
	return "", false
}

// stripNUL removes NUL bytes, which PostgreSQL text and jsonb cannot hold.
func stripNUL(s string) string {
	if strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strings.ReplaceAll(s, "\x00", "")
}

// storableHeaders returns h with every NUL byte of its names and values
// replaced with U+FFFD: jsonb cannot hold \u0000 (SQLSTATE 22P05), and
// json.Marshal already writes invalid UTF-8 as U+FFFD. It returns h itself
// when no header holds a NUL, else a new map (h is not modified); every
// other header is kept as it is. A name so made that h already has keeps
// h's value (the header without NUL wins), and among NUL names made alike
// the first in byte order wins, so that the outcome does not depend on the
// map's order.
func storableHeaders(h map[string]string) map[string]string {
	var nul []string
	for k, v := range h {
		if strings.IndexByte(k, 0) >= 0 || strings.IndexByte(v, 0) >= 0 {
			nul = append(nul, k)
		}
	}
	if len(nul) == 0 {
		return h
	}
	slices.Sort(nul)
	out := make(map[string]string, len(h))
	for k, v := range h {
		if strings.IndexByte(k, 0) < 0 && strings.IndexByte(v, 0) < 0 {
			out[k] = v
		}
	}
	for _, k := range nul {
		name := strings.ReplaceAll(k, "\x00", "\uFFFD")
		if _, taken := out[name]; taken && name != k {
			continue
		}
		out[name] = strings.ReplaceAll(h[k], "\x00", "\uFFFD")
	}
	return out
}
