package postgres_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/postgres"
)

const listenStoppedLog = "berth/postgres: LISTEN stopped: the pool is closed"

// listenSessions counts the LISTEN sessions of the pool tagged app.
func listenSessions(t *testing.T, admin *pgxpool.Pool, app string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = $1 AND query LIKE 'LISTEN %'`, app).Scan(&n); err != nil {
		t.Fatalf("pg_stat_activity: %v", err)
	}
	return n
}

// waitListenSessions waits up to timeout for the pool tagged app to have n
// LISTEN sessions.
func waitListenSessions(t *testing.T, admin *pgxpool.Pool, app string, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := listenSessions(t, admin, app)
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d LISTEN sessions of %s after %s, want %d", got, app, timeout, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestListenStopsWhenPoolClosed: once the application has closed the pool
// (the broker still open), the listener closes its LISTEN connection and
// stops, logging that once, whether the connection is still up (found at
// the listener's next check of the pool) or lost meanwhile (found before
// any reconnect, without the "connection lost" warning); Close still works
// after it, and TestMain's goleak sees no goroutine left. Before, the
// LISTEN connection, made apart from the pool, stayed open, and every loss
// of it was followed by a warning and a reconnect, for as long as the
// broker was not closed.
func TestListenStopsWhenPoolClosed(t *testing.T) {
	for _, how := range []string{"listening", "connection lost"} {
		t.Run(how, func(t *testing.T) {
			app := "berth-listen-closed-" + suffix()
			pool := newPool(t, app, 4)
			admin := newPool(t, "berth-listen-closed-admin-"+suffix(), 2)
			logs := newLogRecorder()
			b := newBroker(t, pool, postgres.Options{Schema: freshSchema(t, admin), Logger: slog.New(logs)})
			ctx := testCtx(t)
			rctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			if _, err := b.Receive(rctx, "q", 1); !errors.Is(err, context.DeadlineExceeded) { // starts the listener
				t.Fatalf("Receive on an empty queue: %v", err)
			}
			cancel()
			waitListenSessions(t, admin, app, 1, 20*time.Second)

			pool.Close()
			if how == "connection lost" {
				terminateBackends(t, admin, app) // the pool's are closed: the LISTEN session only
			}
			waitLog(t, logs, listenStoppedLog, 20*time.Second)
			waitListenSessions(t, admin, app, 0, 20*time.Second)
			if recs, _ := logs.matching(listenStoppedLog); len(recs) != 1 {
				t.Errorf("%d logs %q, want 1", len(recs), listenStoppedLog)
			}
			if recs, _ := logs.matching(listenLostLog); len(recs) != 0 {
				t.Errorf("%d logs %q after the pool was closed, want 0", len(recs), listenLostLog)
			}

			closed := make(chan error, 1)
			go func() { closed <- b.Close() }()
			select {
			case err := <-closed:
				if err != nil {
					t.Errorf("Close: %v", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("Close did not return after the listener stopped")
			}
		})
	}
}
