package postgres_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// TestAckAfterIdleSessionTimeout: the server ends a pooled connection left
// idle past idle_session_timeout (FATAL 57P05, which the client reads only
// with the reply to its next statement); the acker's completion statement,
// sent on that connection, is repeated on a fresh one like after any other
// lost connection (it is idempotent), and the Ack succeeds. Before the fix
// 57P05 was not a lost connection to the retry loop: the Ack failed with
// ErrUnavailable and the job, run to completion, waited out its lease to be
// run again.
func TestAckAfterIdleSessionTimeout(t *testing.T) {
	cfg, err := pgxpool.ParseConfig(integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	// One connection, handed out without a liveness ping (pgxpool pings
	// only connections idle over a second; a shorter idle_session_timeout
	// passes unseen too): the acker gets the one the server ended.
	cfg.MaxConns = 1
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	cfg.ConnConfig.RuntimeParams["application_name"] = "berth-idle-timeout-" + suffix()
	ctx := testCtx(t)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	admin := newPool(t, "berth-idle-timeout-admin-"+suffix(), 2)
	b := newBroker(t, pool, postgres.Options{Schema: freshSchema(t, admin), DisableListen: true,
		Lease: 10 * time.Minute, PollInterval: 50 * time.Millisecond})
	q := "idle_" + suffix()
	ids := publishN(t, b, q, 1)
	d := receiveN(t, b, q, 1)[0]

	// The pool's only connection now ends once idle for 50ms.
	var pid int64
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid() FROM set_config('idle_session_timeout', '50ms', false)`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	for { // until the server has ended that session
		var alive bool
		if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&alive); err != nil {
			t.Fatal(err)
		}
		if !alive {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the idle session was never ended")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatalf("Ack on a pool whose connection idle_session_timeout ended: %v; want it retried on a new connection", err)
	}
	var status string
	if err := admin.QueryRow(ctx, `SELECT status FROM `+b.Schema()+`.jobs WHERE message_id = $1`, ids[0]).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != "completed" {
		t.Fatalf("job after the Ack: status %s, want completed", status)
	}
}

// TestRetentionStopsWhenPoolClosed: once the application has closed the
// pool (the broker still open), the retention loop stops instead of failing,
// and logging that it failed, at every interval: nothing will come from a
// closed pool again. Before the fix it logged "retention failed" every
// RetentionInterval until Close.
func TestRetentionStopsWhenPoolClosed(t *testing.T) {
	pool := newPool(t, "berth-retention-closed-"+suffix(), 2)
	admin := newPool(t, "berth-retention-closed-admin-"+suffix(), 2)
	// The table exists before the retention loop starts.
	migrated := newBroker(t, admin, postgres.Options{Schema: freshSchema(t, admin), DisableListen: true})
	logs := newLogRecorder()
	b, err := postgres.New(pool, postgres.Options{Schema: migrated.Schema(), DisableListen: true,
		Retention: time.Hour, RetentionInterval: 5 * time.Millisecond, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if _, err := b.DeleteCompleted(testCtx(t), time.Hour, 10); err != nil {
		t.Fatalf("DeleteCompleted with the pool open: %v", err)
	}
	pool.Close()

	const (
		failed  = "berth/postgres: retention failed"
		stopped = "berth/postgres: retention stopped: the pool is closed"
	)
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for {
		fails, added := logs.matching(failed)
		if len(fails) > 0 {
			// Let it show whether it goes on (the old loop logs at every
			// interval); the loop that stops logs no failure at all.
			for len(fails) < 3 {
				select {
				case <-added:
				case <-deadline.C:
					t.Fatalf("retention logged %d failure(s) after the pool was closed: %v", len(fails), attr(fails[0], "err"))
				}
				fails, added = logs.matching(failed)
			}
			t.Fatalf("retention logged %d failures after the pool was closed, and goes on: %v", len(fails), attr(fails[0], "err"))
		}
		if recs, _ := logs.matching(stopped); len(recs) > 0 {
			break
		}
		select {
		case <-added:
		case <-deadline.C:
			t.Fatal("the retention loop neither stopped nor failed after the pool was closed")
		}
	}
}

// TestPoolClosedDuringConnect: the application closes the pool while an
// operation waits for the pool to open a connection (the server has not
// answered the connect yet); the pool's Close cuts that connect with a
// cancelled context. The operation reports sdk.ErrClosed, as every call on
// a closed pool does, not sdk.ErrUnavailable "no answer within the
// broker's time limit" (no limit of the broker ran out): a Worker told
// unavailable retries, a retention loop logs a failure. Before the fix the
// cancelled connect was taken for the broker's own time limit.
func TestPoolClosedDuringConnect(t *testing.T) {
	for _, op := range []string{"Receive", "DeleteCompleted"} {
		t.Run(op, func(t *testing.T) {
			cfg, proxy := proxiedConfig(t)
			ctx := testCtx(t)
			pool, err := pgxpool.NewWithConfig(ctx, cfg) // no connection yet
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			admin := newPool(t, "berth-closed-connect-admin-"+suffix(), 2)
			migrated := newBroker(t, admin, postgres.Options{DisableListen: true})
			b, err := postgres.New(pool, postgres.Options{Schema: migrated.Schema(), DisableListen: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Close() })

			proxy.Freeze() // the connect gets no answer
			t.Cleanup(proxy.Thaw)
			done := make(chan error, 1)
			go func() {
				var err error
				if op == "Receive" {
					_, err = b.Receive(ctx, "closed_connect", 1)
				} else {
					_, err = b.DeleteCompleted(ctx, time.Hour, 10)
				}
				done <- err
			}()
			for pool.Stat().ConstructingConns() == 0 { // the connect is under way
				select {
				case err := <-done:
					t.Fatalf("%s returned before its connect: %v", op, err)
				case <-ctx.Done():
					t.Fatal("no connect began")
				case <-time.After(5 * time.Millisecond):
				}
			}
			pool.Close()
			if err := <-done; !errors.Is(err, sdk.ErrClosed) || errors.Is(err, sdk.ErrUnavailable) {
				t.Fatalf("%s whose connect the pool's Close cut: %v; want an error wrapping sdk.ErrClosed (and not ErrUnavailable)", op, err)
			}
		})
	}
}

// TestListenOutlivesIdleSessionTimeout: with idle_session_timeout set for
// the broker's sessions (here on the pool's connections; a role's or a
// database's setting acts alike), the LISTEN connection, idle by design
// while it waits for notifications, is not ended at every period: the
// broker turns the timeout off for that one session. Before the fix the
// server ended it (57P05) every 100ms here, and each time the broker
// logged the loss, reconnected and missed the notifications sent meanwhile.
func TestListenOutlivesIdleSessionTimeout(t *testing.T) {
	cfg, err := pgxpool.ParseConfig(integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	app := "berth-listen-idle-" + suffix()
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.ConnConfig.RuntimeParams["idle_session_timeout"] = "100ms"
	ctx := testCtx(t)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	admin := newPool(t, "berth-listen-idle-admin-"+suffix(), 2)
	migrated := newBroker(t, admin, postgres.Options{DisableListen: true})
	logs := newLogRecorder()
	b, err := postgres.New(pool, postgres.Options{Schema: migrated.Schema(), PollInterval: time.Hour, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	// The first Receive starts the listener.
	rctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, _ = b.Receive(rctx, "listen_idle", 1)
	cancel()

	var pid int64
	for { // until the listener listens
		err := admin.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
			WHERE application_name = $1 AND query LIKE 'LISTEN %' AND state = 'idle'`, app).Scan(&pid)
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the listener never listened: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	// Twenty periods of the timeout: the old listener lost its connection
	// in each.
	window := time.NewTimer(2 * time.Second)
	defer window.Stop()
	for {
		recs, added := logs.matching(listenLostLog)
		if len(recs) > 0 {
			t.Fatalf("the LISTEN connection was lost under idle_session_timeout: %v", attr(recs[0], "err"))
		}
		select {
		case <-added:
			continue
		case <-window.C:
		}
		break
	}
	var alive bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&alive); err != nil {
		t.Fatal(err)
	}
	if !alive {
		t.Fatal("the LISTEN session was ended")
	}
}
