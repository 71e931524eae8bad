package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/puddle/v2"
)

// recoverMaxWait is the longest recoverClaim waits between two looks.
const recoverMaxWait = 500 * time.Millisecond

// recoverClaim is called when the claim statement, sent on conn, failed
// with err. When the connection was lost after the statement was sent (conn
// is closed, by a network failure, by the claim's time limit or by the
// server ending the session, and err is not an error from before anything
// was sent), the server may have committed the claim
// while its reply was lost: the rows would stay leased to nobody for a
// whole lease, an attempt spent. recoverClaim then hands them back in
// the background, on another connection: the claim wrote token into
// lease_token, so its rows are found without their ids, released as
// handBack does (ready at once, attempt_count restored), and the queue
// notified.
//
// The claim may still be running on the server when its connection is
// found broken (a commit waiting for its WAL flush, say), or not have
// reached it yet: the hand-back looks until pid, the claim's server
// process, is gone, so that a claim committed after the first look is not
// missed.
// The whole recovery is bounded by the claim limit and the lease (the rows
// come back after their lease anyway); one under way at Close is given
// Close's grace (closeGrace) to finish, and one not started when Close
// began is not run. Rows it cannot hand back are logged, and come back
// after their lease.
func (b *Broker) recoverClaim(conn *pgxpool.Conn, queue, token string, pid uint32, err error) {
	// A server error on a connection still open rolled the claim back
	// (an error of its statement or of its commit). One that closed the
	// connection (FATAL: a shutdown, pg_terminate_backend, a pooler that
	// lost its server) ended the session, not necessarily the claim: it
	// may come after the commit, before the ReadyForQuery, and is
	// recovered as a lost connection is.
	if pgconn.SafeToRetry(err) || !conn.Conn().PgConn().IsClosed() {
		return // never sent, or answered
	}
	bound := min(b.claimTimeout, b.opts.Lease)
	if !b.goOwnedIfOpen(func() { b.recoverLoop(queue, token, pid, err, bound) }) {
		b.opts.Logger.Warn("berth/postgres: a claim's reply was lost at Close; the jobs it may have taken come back after their lease",
			"queue", queue, "err", err)
	}
}

// recoverLoop looks for the rows of the claim made with token until they
// are handed back, the claim is known to have taken none, bound runs out,
// or the application has closed the pool.
func (b *Broker) recoverLoop(queue, token string, pid uint32, cause error, bound time.Duration) {
	ctx, cancel := context.WithTimeout(b.handBacks, bound)
	defer cancel()
	wait := minWait
	for {
		n, finished, err := b.handBackToken(ctx, queue, token, pid)
		switch {
		case err == nil && n > 0:
			b.opts.Logger.Warn("berth/postgres: a claim's reply was lost; the jobs it took are handed back (no attempt counted)",
				"queue", queue, "jobs", n, "err", cause)
			return
		case err == nil && finished:
			b.opts.Logger.Debug("berth/postgres: a claim's reply was lost; it took no job",
				"queue", queue, "err", cause)
			return
		case errors.Is(err, puddle.ErrClosedPool):
			// The application closed the pool: no later look can
			// work, and Close would wait for this one for nothing.
			b.notHandedBack(queue, cause, b.wrap(context.Background(), "hand back", err))
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			if err == nil {
				err = errors.New("the claim's server process is still there")
			}
			b.notHandedBack(queue, cause, err)
			return
		case <-t.C:
		}
		wait = min(wait*2, recoverMaxWait)
	}
}

// notHandedBack logs that the rows of a claim whose reply was lost (with
// cause) could not be handed back, for err.
func (b *Broker) notHandedBack(queue string, cause, err error) {
	b.opts.Logger.Warn("berth/postgres: a claim's reply was lost and the jobs it may have taken could not be handed back; they come back after their lease",
		"queue", queue, "err", cause, "hand_back_err", err)
}

// handBackToken runs one look of recoverLoop: first whether the claim's
// server process pid is gone, then, in a later statement and so on a later
// snapshot, the hand-back of the rows still leased with token. n counts the
// rows handed back; finished means none is left to find. A process that is
// idle has not finished the claim: it may not have read it yet (a request
// delayed on the network, behind which the client gave up), and runs it
// when it arrives; it ends at the Terminate pgx sends when it closes the
// connection, or when the server finds the connection closed. A pid of a
// pooler, not of a server process, is not found: one look then decides.
func (b *Broker) handBackToken(ctx context.Context, queue, token string, pid uint32) (n int64, finished bool, err error) {
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return 0, false, err
	}
	defer conn.Release()
	if err := conn.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity
		WHERE pid = $1 AND pid <> pg_backend_pid())`, int64(pid)).Scan(&finished); err != nil {
		return 0, false, err
	}
	// available_at bounds the scan of the claim index to leases still
	// running: the claim's rows are due at its now() + Lease.
	tag, err := conn.Exec(ctx, `UPDATE `+b.table+` AS j SET
		status = `+releasedStatus+`,
		attempt_count = greatest(attempt_count - 1, 0),
		available_at = now(), visibility_until = NULL, updated_at = now()
		WHERE queue = $1 AND status = 'processing'
		AND available_at > now() AND available_at <= now() + $3 * interval '1 microsecond'
		AND lease_token = $2::uuid`, queue, token, b.opts.Lease.Microseconds())
	if err != nil {
		return 0, false, err
	}
	if n = tag.RowsAffected(); n > 0 {
		if _, err := conn.Exec(ctx, `SELECT pg_notify($1, $2)`, b.channel, queue); err != nil {
			// Handed back: a polling Receive finds them.
			b.opts.Logger.Debug("berth/postgres: notify after a hand-back failed", "queue", queue, "err", err)
		}
	}
	return n, finished, nil
}

// goOwnedIfOpen runs f as goOwned does unless the broker is closed, and
// reports whether it did.
func (b *Broker) goOwnedIfOpen(f func()) bool {
	b.ownMu.Lock()
	defer b.ownMu.Unlock()
	if b.isClosed() {
		return false
	}
	b.goOwned(f)
	return true
}
