package doctor_test

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/ledger/pgledger"
)

// readTimeout is a client's own read timeout (a net.Error), as a TCP
// timeout or a proxy's.
type readTimeout struct{}

func (readTimeout) Error() string   { return "read tcp: i/o timeout" }
func (readTimeout) Timeout() bool   { return true }
func (readTimeout) Temporary() bool { return true }

// progressConn is a connection that stops answering, with a read timeout,
// once a query that reads pg_stat_progress_create_index is sent on it.
type progressConn struct {
	net.Conn
	hung atomic.Bool
}

func (c *progressConn) Write(b []byte) (int, error) {
	if bytes.Contains(b, []byte("pg_stat_progress_create_index")) {
		c.hung.Store(true)
		return len(b), nil
	}
	return c.Conn.Write(b)
}

func (c *progressConn) Read(b []byte) (int, error) {
	if c.hung.Load() {
		return 0, readTimeout{}
	}
	return c.Conn.Read(b)
}

// progressTimesOut returns a pool whose connections time out on a read of
// pg_stat_progress_create_index, the caller's context still alive.
func progressTimesOut(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return configuredPool(t, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &progressConn{Conn: c}, nil
		}
	})
}

// TestProgressViewTimeoutIsATimeout: where the query of
// pg_stat_progress_create_index times out (here the client's read timeout,
// the check's context still alive), both index checks say so, as a
// doctor.check-timeout finding, as they do for any other query of theirs.
// The view did not answer: nothing says doctor's user cannot read it. The
// broker's check did; the ledger's read the timeout as an unreadable view
// and printed its indexes' fixes with "doctor's user cannot read
// pg_stat_progress_create_index".
func TestProgressViewTimeoutIsATimeout(t *testing.T) {
	u, pool, schema := pgURL(t, nil)
	open(t, u) // migrates
	ctx := testCtx(t)
	migratedLedger(t, pool, schema)
	// An invalid index on each table, so that the view is read.
	execAll(t, pool,
		`UPDATE pg_index SET indisvalid = false WHERE indexrelid = '`+pgx.Identifier{schema, "jobs_completed_idx"}.Sanitize()+`'::regclass`,
		`UPDATE pg_index SET indisvalid = false WHERE indexrelid = '`+pgx.Identifier{schema, "ledger_jobs_updated_idx"}.Sanitize()+`'::regclass`)
	hung := progressTimesOut(t)

	fs, err := doctor.Postgres(ctx, hung, schema, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if f := find(fs, "doctor.check-timeout", schema+".jobs"); len(f) != 1 || !strings.Contains(f[0].Evidence, "i/o timeout") {
		t.Errorf("postgres: %s; want the check's timeout, its evidence the read's", ids(fs))
	}

	store, err := pgledger.New(hung, pgledger.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	fs, err = doctor.Ledger(ctx, store, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	table := schema + ".ledger_jobs"
	if f := find(fs, "ledger.indexes", table); len(f) != 0 {
		t.Errorf("ledger.indexes: %+v; want none: the index check timed out", f)
	}
	if f := find(fs, "doctor.check-timeout", table); len(f) != 1 || !strings.Contains(f[0].Evidence, "i/o timeout") {
		t.Errorf("ledger: %s; want the index check's timeout, its evidence the read's", ids(fs))
	}
}
