package pgretry

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/puddle/v2"
)

// ClosedBy reports whether err, from a call on pool made with a context
// that is still live, says the application closed pool: an acquire from a
// closed pool fails with puddle.ErrClosedPool, and a connect under way when
// it closed (or the application's connect hook) is cut with a cancelled
// context (ConnectCut), for which the pool is probed (PoolClosed). Any other failure (the database down, a
// connect refused or timed out) is not a closed pool.
func ClosedBy(pool *pgxpool.Pool, err error) bool {
	return errors.Is(err, puddle.ErrClosedPool) || (ConnectCut(err) && PoolClosed(pool))
}

// ConnectCut reports whether err holds a cancel: berth's own limits are
// deadlines, so when the caller's context is live the cancel came from the
// pool, whose Close cancels the context of the connects under way. That
// context is also the one pgxpool gives the application's BeforeConnect and
// AfterConnect hooks, whose errors are their own (a password fetched over
// HTTP, a statement that loads types), not a *pgconn.ConnectError, so any
// cancel counts; PoolClosed tells. A deadline beside the cancel does not
// rule it out: a connect to several hosts (host=a,b, or a name with several
// addresses) joins the error of each, and one host may have run out of its
// connect_timeout before the pool's Close cut the connect to the next.
func ConnectCut(err error) bool {
	return errors.Is(err, context.Canceled)
}

// poolProbe bounds how long PoolClosed waits for its acquire.
const poolProbe = 100 * time.Millisecond

// poolProbePing bounds PoolClosed's acquire, which goes on after PoolClosed
// has stopped waiting for it: the ping pgxpool may run on the connection it
// takes, and the application's BeforeAcquire or PrepareConn hook.
const poolProbePing = 10 * time.Second

// poolProbeStep is how often PoolClosed looks again at a pool with a
// connect under way and no idle connection.
const poolProbeStep = 5 * time.Millisecond

// PoolClosed reports whether the application has closed pool: an acquire
// from a closed pool fails with puddle.ErrClosedPool. It takes a connection
// from an open pool (and gives it back), or waits up to 100 ms for one, so
// it is asked only for an error that a closed pool explains and by
// watchers; when it cannot tell, the pool is taken for open.
//
// It never adds a connect to one under way: with no idle connection,
// pgxpool's acquire starts a connect that goes on beyond the acquire's
// context, holding a slot of the pool until it ends (and without a
// connect_timeout, a database that accepts and never answers, or an
// address black-holed by the network, never ends it), so a probe every
// 5 s (the LISTEN watcher's) filled the pool with hung connects. While
// the pool shows a connect under way and no idle connection, PoolClosed
// looks again every 5 ms and, if that lasts 100 ms, cannot tell: a closed
// pool has none for long, as its Close cancels the connects under way and
// they end at once (a hook that ignores its context aside). A probe that
// finds none under way and no idle connection starts one connect, which
// the next probe finds under way; probes at the same moment may each
// start one.
//
// The acquire is not cut when PoolClosed stops waiting: it goes on, on
// its own goroutine, for up to poolProbePing, then gives the connection
// back. pgxpool gives the acquire's context to the ping of a
// connection idle for more than a second (which it destroys when the ping
// fails) and to the application's BeforeAcquire or PrepareConn hook (a
// statement cut by a cancel closes its connection), so a 100 ms limit
// destroyed a healthy connection at every probe wherever a round trip takes
// longer (a database in another region, a loaded server). The goroutine
// ends with the acquire, within poolProbePing plus what a hook that ignores
// its context takes; like pgxpool's own ping of an abandoned acquire, it
// has no other owner. In a pool whose connections are all in use it waits
// its turn, and gives the connection it gets back at once.
func PoolClosed(pool *pgxpool.Pool) bool {
	wait := time.NewTimer(poolProbe)
	defer wait.Stop()
	for {
		s := pool.Stat()
		if s.IdleConns() > 0 || s.ConstructingConns() == 0 {
			break
		}
		select {
		case <-wait.C:
			return false // a connect under way: cannot tell
		case <-time.After(poolProbeStep):
		}
	}
	done := make(chan bool, 1) // the goroutine never blocks on it
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), poolProbePing)
		defer cancel()
		conn, err := pool.Acquire(ctx)
		if err != nil {
			done <- errors.Is(err, puddle.ErrClosedPool)
			return
		}
		conn.Release()
		done <- false
	}()
	select {
	case closed := <-done:
		return closed
	case <-wait.C:
		return false
	}
}
