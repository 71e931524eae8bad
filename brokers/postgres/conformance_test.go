package postgres_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/brokertest"
	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

func TestConformance(t *testing.T) {
	pool := newPool(t, "berth-conformance-"+suffix(), 16)
	const lease, maxDeliveries = time.Second, 3
	opts := postgres.Options{
		Lease:        lease,
		MaxAttempts:  maxDeliveries,
		PollInterval: 200 * time.Millisecond,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	brokertest.Run(t, brokertest.Harness{
		New: func(t *testing.T) sdk.Broker {
			return newBroker(t, pool, opts)
		},
		Lease:          lease,
		MaxDeliveries:  maxDeliveries,
		MaxMessageSize: postgres.DefaultMaxMessageSize,
		// A queue is a value in the job table's queue column.
		Undeclared: brokertest.UndeclaredCreated,
		// Migrate is the broker's declaration: on a schema where it never
		// ran, no queue exists and the server says so (42P01).
		NewNoDeclare: func(t *testing.T) sdk.Broker {
			o := opts
			o.Schema = "berth_never_migrated_" + suffix()
			b, err := postgres.New(pool, o)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			return b
		},
		As: func(err error) bool {
			var pgErr *pgconn.PgError
			return errors.As(err, &pgErr)
		},
		Peer: func(t *testing.T, b sdk.Broker) sdk.Broker {
			o := opts
			o.Schema = b.(*postgres.Broker).Schema()
			return newBroker(t, pool, o)
		},
		// The broker's sessions are cut by terminating its server backends
		// (pg_terminate_backend), found by the pool's application_name.
		Faulty: func(t *testing.T) (sdk.Broker, func()) {
			app := "berth-conformance-cut-" + suffix()
			b := newBroker(t, newPool(t, app, 4), opts)
			return b, func() { terminateBackends(t, pool, app) }
		},
		Unsupported: map[brokertest.Capability]string{
			brokertest.CapNULHeader: "PostgreSQL text and jsonb cannot hold NUL bytes: headers with NUL are refused",
			brokertest.CapOrderingKey: "jobs are claimed by available_at, not by ordering_key: jobs published in one statement " +
				"share it, and concurrent claims skip locked rows, so no order within a key is promised",
		},
	})
}

// terminateBackends ends every server session of the pool tagged app, as a
// server restart or a network failure would, through admin (another pool).
func terminateBackends(t *testing.T, admin *pgxpool.Pool, app string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	if err := admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
		FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
		t.Fatalf("pg_terminate_backend: %v", err)
	}
	if n == 0 {
		t.Errorf("no session of %s to terminate", app)
	}
}
