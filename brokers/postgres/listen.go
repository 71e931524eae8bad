package postgres

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// waker lets Receive calls wait for a queue's notification. Each queue has a
// channel that is closed (and replaced) when the queue is notified.
type waker struct {
	mu    sync.Mutex
	chans map[string]chan struct{}
}

func newWaker() *waker { return &waker{chans: make(map[string]chan struct{})} }

// wait returns a channel closed at the next notification of queue. Take it
// before querying the table, so a notification that arrives between the query
// and the wait is not missed.
func (w *waker) wait(queue string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch, ok := w.chans[queue]
	if !ok {
		ch = make(chan struct{})
		w.chans[queue] = ch
	}
	return ch
}

// notify wakes the waiters of queue.
func (w *waker) notify(queue string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ch, ok := w.chans[queue]; ok {
		close(ch)
		delete(w.chans, queue)
	}
}

// notifyAll wakes every waiter: after the listener (re)connects, notifications
// sent while it was away are lost, so everyone looks at the table again.
func (w *waker) notifyAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for q, ch := range w.chans {
		close(ch)
		delete(w.chans, q)
	}
}

// startListening lets the listener connect; called by the first Receive, so a
// publish-only broker holds no LISTEN connection.
func (b *Broker) startListening() {
	b.listenOnce.Do(func() { close(b.listenGo) })
}

// Reconnect delays of the LISTEN connection: from listenMinBackoff, doubled
// at each failure up to listenMaxBackoff, and back to listenMinBackoff
// only after a connection proved healthy: it delivered a notification, or
// it stayed up listenHealthy. A server (or a proxy in front of it) that
// accepts the LISTEN and drops the connection at once sees growing
// delays, not a reconnect every listenMinBackoff for ever.
const (
	listenMinBackoff = 50 * time.Millisecond
	listenMaxBackoff = 5 * time.Second
	listenHealthy    = 10 * time.Second
)

// listenPoolCheck is how often the listener, while it listens, checks that
// the application has not closed the pool (see Broker.poolClosed).
const listenPoolCheck = 5 * time.Second

// errPoolClosed ends the listener's context when the pool is found closed.
var errPoolClosed = errors.New("berth/postgres: the pool is closed")

// listen owns the broker's LISTEN connection, a dedicated connection made from
// the pool's configuration (LISTEN needs a session; a pooled connection would
// be handed to others). It relays each notification (payload: the queue name)
// to the waiting Receive calls and reconnects with backoff when the
// connection fails; while it is down, Receive polls. It returns when ctx is
// cancelled by Close, or once the application has closed the pool: nothing
// comes from a closed pool again (every Receive fails with [sdk.ErrClosed]),
// so it closes its connection and stops, logging that once, rather than
// holding a server connection and reconnecting, with a warning each time,
// for ever. It checks the pool before each connect, when the connection
// fails, and every listenPoolCheck while it listens.
func (b *Broker) listen(ctx context.Context) {
	select {
	case <-b.listenGo:
	case <-ctx.Done():
		return
	}
	// lctx also ends, with errPoolClosed, when the watcher finds the pool
	// closed.
	lctx, stop := context.WithCancelCause(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		b.watchPool(lctx, stop)
	}()
	defer func() {
		stop(nil)
		<-watched
	}()
	// poolGone reports (and logs, once: the listener returns) a closed pool.
	poolGone := func() bool {
		if !errors.Is(context.Cause(lctx), errPoolClosed) && !b.poolClosed() {
			return false
		}
		b.opts.Logger.Info("berth/postgres: LISTEN stopped: the pool is closed", "schema", b.schema)
		return true
	}
	backoff := listenMinBackoff
	for {
		if ctx.Err() != nil || poolGone() {
			return
		}
		healthy, err := b.listenOnceConn(lctx)
		if ctx.Err() != nil || poolGone() {
			return
		}
		if healthy {
			backoff = listenMinBackoff // it worked for a while: reconnect quickly
		}
		b.opts.Logger.Warn("berth/postgres: LISTEN connection lost; polling until it is back",
			"schema", b.schema, "err", err, "retry_in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-lctx.Done(): // Close, or the pool found closed: the loop's top tells
		case <-t.C:
		}
		t.Stop()
		backoff = min(backoff*2, listenMaxBackoff)
	}
}

// watchPool checks every listenPoolCheck, until ctx ends, whether the
// application has closed the pool, and if so ends ctx with errPoolClosed.
func (b *Broker) watchPool(ctx context.Context, stop context.CancelCauseFunc) {
	t := time.NewTicker(listenPoolCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if b.poolClosed() {
			stop(errPoolClosed)
			return
		}
	}
}

// listenOnceConn connects, listens and relays until the connection fails.
// healthy reports whether the connection, once listening, delivered a
// notification or stayed up listenHealthy: a LISTEN that succeeds on a
// connection dropped at once does not count. The connection is made from
// the pool's ConnConfig: pool hooks (BeforeConnect, AfterConnect) do not
// run on it.
func (b *Broker) listenOnceConn(ctx context.Context) (healthy bool, err error) {
	conn, err := pgx.ConnectConfig(ctx, b.pool.Config().ConnConfig.Copy())
	if err != nil {
		return false, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if err := keepIdleSession(ctx, conn); err != nil {
		return false, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+quoteIdent(b.channel)); err != nil {
		return false, err
	}
	listening := time.Now()
	// Anything published while we were not listening is found by a new look.
	b.wake.notifyAll()
	notified := false
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return notified || time.Since(listening) >= listenHealthy, err
		}
		notified = true
		b.wake.notify(n.Payload)
	}
}

// keepIdleSession turns idle_session_timeout off for the LISTEN
// connection's session: it waits for notifications without sending a
// statement, which the server counts as idle, and a timeout set for the
// role or the database (to end forgotten sessions) would end it every
// period (FATAL 57P05), each time a reconnect, a warning and the
// notifications sent meanwhile lost. A server without the setting
// (before PostgreSQL 14) has no such timeout.
func keepIdleSession(ctx context.Context, conn *pgx.Conn) error {
	_, err := conn.Exec(ctx, "SET idle_session_timeout = 0")
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42704" { // undefined_object: unrecognized configuration parameter
		return nil
	}
	return err
}
