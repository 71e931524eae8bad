package doctor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// checkTimeoutID is the ID of the finding of a check that did not answer.
const checkTimeoutID = "doctor.check-timeout"

// DefaultCheckTimeout is the default of [Options.CheckTimeout].
const DefaultCheckTimeout = 10 * time.Second

// answerGrace is how long a check whose deadline passed is given to return
// its own error, which names the call that hung, before it is left behind.
const answerGrace = time.Second

// within runs f under a deadline d from now and returns what it returns.
// A call that does not honour its context (amqp091's channel calls) is left
// running once the deadline has passed, with its result discarded, and
// within returns an error wrapping [context.DeadlineExceeded]: the check
// ends either way. Closing the broker or pool ends such a call. When ctx
// has ended already (the run's deadline passed), f is not started: a check
// that ignores its context would otherwise send one more call to a server
// that does not answer, and hold the run for answerGrace, once per check
// left.
func within[T any](ctx context.Context, d time.Duration, f func(context.Context) (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, fmt.Errorf("not started, the run had ended: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1) // the abandoned call's send never blocks
	go func() {
		v, err := f(cctx)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-cctx.Done():
	}
	grace := time.NewTimer(answerGrace)
	defer grace.Stop()
	select {
	case r := <-done:
		return r.v, r.err
	case <-grace.C:
		waited := fmt.Sprintf("after %s", d)
		if ctx.Err() != nil { // the run's deadline came first
			waited = "before the run's deadline"
		}
		return zero, fmt.Errorf("no answer %s (a call that takes no context, such as amqp091's, was left waiting): %w", waited, cctx.Err())
	}
}

// timedOut reports whether err, returned by a check run with ctx, means
// that something did not answer in time rather than that it answered with
// an error: a deadline (the check's or ctx's) or a network timeout (a
// client's own, such as go-redis's read timeout). A cancelled ctx (an
// interrupt) is not a timeout: the run stops.
func timedOut(ctx context.Context, err error) bool {
	if err == nil || errors.Is(ctx.Err(), context.Canceled) {
		return false
	}
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// bounded runs check (what, on where: a queue, a table) within
// o.CheckTimeout. If it does not answer in time it returns, instead of its
// error, a doctor.check-timeout finding that says what did not answer, so
// that the other checks still run; any other error is returned.
func bounded(ctx context.Context, o Options, what, where string, check func(context.Context) ([]Finding, error)) ([]Finding, error) {
	fs, err := within(ctx, o.CheckTimeout, check)
	if err == nil || !timedOut(ctx, err) {
		return fs, err
	}
	return []Finding{timeoutFinding(ctx, o, what, where, err)}, nil
}

// timeoutFinding is the doctor.check-timeout finding of a check (what, on
// where) that ended with err, a timeout.
func timeoutFinding(ctx context.Context, o Options, what, where string, err error) Finding {
	f := Finding{ID: checkTimeoutID, Severity: Error, Queue: where,
		Summary:  fmt.Sprintf("the %s did not answer within %s: not checked", what, o.CheckTimeout),
		Evidence: err.Error(),
		Fix:      "check that the server answers (a hung broker or database stalls the Workers too); if it is only slow, raise -check-timeout (Options.CheckTimeout)"}
	var ct *clientTimeout
	var ne net.Error
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		f.Summary = fmt.Sprintf("the %s did not finish before doctor's overall deadline: not checked", what)
		f.Fix = "check that the server answers; if it is only slow, raise -timeout (the overall deadline) or name fewer queues"
	case errors.As(err, &ct):
		// The client gave up first: CheckTimeout had not passed, and
		// raising it would change nothing.
		f.Summary = fmt.Sprintf("the %s did not answer within the %s (%s): not checked", what, ct.name, ct.figure)
		f.Fix = "check that the server answers (a hung server stalls the Workers too); if it is only slow, raise the " + ct.name
	case !errors.Is(err, context.DeadlineExceeded) && errors.As(err, &ne) && ne.Timeout():
		f.Summary = fmt.Sprintf("the %s did not answer within its client's own timeout: not checked", what)
		f.Fix = "check that the server answers (a hung server stalls the Workers too); if it is only slow, raise the client's timeout"
	}
	return f
}

// clientTimeout is the error of a call that its client ended on a timeout
// of its own (go-redis's read timeout), rather than on the check's
// deadline.
type clientTimeout struct {
	name   string // "Redis client's read timeout"
	figure string // "5s"
	err    error
}

func (e *clientTimeout) Error() string { return e.err.Error() }
func (e *clientTimeout) Unwrap() error { return e.err }

// scanShare divides a check's budget for one of its scans of a whole table
// (postgres.queue-unknown's queue names, idempotency.retention's latest
// results), which may take 1/scanShare of it: on a huge table such a scan
// can outlast the budget, and the check's other findings must not be lost
// with it.
const scanShare = 3

// scanBudget is how long a scan of a whole table may run within ctx: a
// third of o.CheckTimeout, and at most half the time left before ctx's
// deadline (the rest of the check runs after it); at least 1ms.
func scanBudget(ctx context.Context, o Options) time.Duration {
	b := o.CheckTimeout / scanShare
	if dl, ok := ctx.Deadline(); ok {
		b = min(b, time.Until(dl)/2)
	}
	return max(b, time.Millisecond)
}

// scanCut is the error of a scan that the server cancelled at the
// statement_timeout boundedScan set.
type scanCut struct {
	budget time.Duration // the statement_timeout
	err    error         // the server's error (57014 query_canceled)
}

func (e *scanCut) Error() string {
	return fmt.Sprintf("cancelled at its statement_timeout (%s): %v", e.budget, e.err)
}
func (e *scanCut) Unwrap() error { return e.err }

// queryCanceled is the SQLSTATE of a statement cancelled by its
// statement_timeout (or by a cancel request).
const queryCanceled = "57014"

// boundedScan runs scan in a transaction of its own whose statement_timeout
// (SET LOCAL, through set_config) is budget, or the session's own when that
// is shorter: the server cancels a statement that runs longer, lock waits
// included, and boundedScan then returns a *scanCut, for the check to
// report that it was cut (cutEvidence) rather than fail. Any other error is
// returned as is.
func boundedScan(ctx context.Context, pool *pgxpool.Pool, budget time.Duration, scan func(context.Context, pgx.Tx) error) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		// The transaction only read: rolling it back just ends it (on a
		// context already ended, pgx closes the connection instead).
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	// pg_settings gives statement_timeout in milliseconds; 0 is none.
	ms := max(budget.Milliseconds(), 1)
	var set string
	if err := tx.QueryRow(ctx, `SELECT x.ms, set_config('statement_timeout', x.ms::text, true)
		FROM (SELECT CASE WHEN setting::bigint > 0 AND setting::bigint < $1 THEN setting::bigint ELSE $1 END AS ms
			FROM pg_settings WHERE name = 'statement_timeout') x`, ms).Scan(&ms, &set); err != nil {
		return err
	}
	err = scan(ctx, tx)
	var pe *pgconn.PgError
	if ctx.Err() == nil && errors.As(err, &pe) && pe.Code == queryCanceled {
		return &scanCut{budget: time.Duration(ms) * time.Millisecond, err: err}
	}
	return err
}

// cutEvidence is the evidence of a finding whose scan (what) boundedScan
// cut with c.
func cutEvidence(what string, c *scanCut) string {
	return fmt.Sprintf("%s was cut at its statement_timeout (%s), so that doctor's other checks keep their time: "+
		"the table is too large to scan within it, or the scan waited for a lock", what, c.budget)
}
