package pgretry

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/puddle/v2"
)

// ClosedBy reports whether err, from a call on pool made with a context
// that is still live, says the application closed pool: an acquire from a
// closed pool fails with puddle.ErrClosedPool, and a connect under way when
// it closed is cut with a cancelled context (ConnectCut), for which the
// pool is probed (PoolClosed). Any other failure (the database down, a
// connect refused or timed out) is not a closed pool.
func ClosedBy(pool *pgxpool.Pool, err error) bool {
	return errors.Is(err, puddle.ErrClosedPool) || (ConnectCut(err) && PoolClosed(pool))
}

// ConnectCut reports whether err is a connect cancelled, not timed out:
// berth's own limits are deadlines, so when the caller's context is live
// the cancel came from the pool, whose Close cuts the connects under way.
func ConnectCut(err error) bool {
	var connectErr *pgconn.ConnectError
	return errors.As(err, &connectErr) && errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// poolProbe bounds how long PoolClosed waits for its acquire.
const poolProbe = 100 * time.Millisecond

// poolProbePing bounds the ping pgxpool may run on the connection
// PoolClosed's acquire takes.
const poolProbePing = 10 * time.Second

// PoolClosed reports whether the application has closed pool: an acquire
// from a closed pool fails with puddle.ErrClosedPool. It takes a connection
// from an open pool (and gives it back), or waits up to 100 ms for one, so
// it is asked only for an error that a closed pool explains and by
// watchers; when it cannot tell, the pool is taken for open.
//
// The acquire is cancelled after 100 ms rather than given it as a
// deadline: pgxpool pings a connection idle for more than a second with
// the acquire's deadline and destroys it when the ping fails, so a 100 ms
// deadline destroyed a healthy connection at every probe wherever a round
// trip takes longer (a database in another region, a loaded server).
// Cancelled, the acquire returns while pgxpool lets the ping finish, within
// poolProbePing, and puts the connection back.
func PoolClosed(pool *pgxpool.Pool) bool {
	ctx, cancel := context.WithTimeout(context.Background(), poolProbePing)
	defer cancel()
	probe := time.AfterFunc(poolProbe, cancel)
	defer probe.Stop()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return errors.Is(err, puddle.ErrClosedPool)
	}
	conn.Release()
	return false
}
