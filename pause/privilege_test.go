package pause_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/pause"
)

// TestMigrateOnMigratedTableNeedsNoCreatePrivilege: once the table exists
// (made by a migration role), Migrate run by a role that may only read and
// write it — an operator's for `berth queue pause` or the dashboard, an
// application's Worker that runs Migrate as it starts — succeeds, as every
// other part's Migrate does (pgschema.Present). Before, it ran CREATE
// SCHEMA/TABLE IF NOT EXISTS every time, which PostgreSQL checks for the
// CREATE privilege (on the database, on the schema) before it finds that
// the object exists: "permission denied for database", so `berth queue
// pause` and a writable `berth ui` could not start with such a role.
func TestMigrateOnMigratedTableNeedsNoCreatePrivilege(t *testing.T) {
	_, pool, schema := newStore(t) // migrated by the owner
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	role := schema + "_op"
	qr, qs := pgx.Identifier{role}.Sanitize(), pgx.Identifier{schema}.Sanitize()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, `DROP OWNED BY `+qr)
		_, _ = pool.Exec(ctx, `DROP ROLE `+qr)
	})
	pgtest.Exec(t, pool,
		`CREATE ROLE `+qr+` LOGIN`,
		`GRANT USAGE ON SCHEMA `+qs+` TO `+qr,
		`GRANT SELECT, INSERT, DELETE ON `+qs+`.paused_queues TO `+qr,
	)
	u, err := url.Parse(integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	op, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	s, err := pause.NewPG(op, pause.PGOptions{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate of the migrated table by a role without CREATE: %v", err)
	}
	if changed, err := s.Pause(ctx, "emails"); err != nil || !changed {
		t.Fatalf("Pause: %v %v", changed, err)
	}
	if ps, err := s.Paused(ctx); err != nil || len(ps) != 1 || ps[0].Queue != "emails" {
		t.Fatalf("Paused = %+v, %v", ps, err)
	}
	if changed, err := s.Resume(ctx, "emails"); err != nil || !changed {
		t.Fatalf("Resume: %v %v", changed, err)
	}
}
