package doctor_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/ledger/pgledger"
)

// progressRefused returns a pool on which pg_stat_progress_create_index
// cannot be read, as where its SELECT is revoked: a view of that name in
// schema, first on the pool's search_path, raises insufficient_privilege
// (the shared database's own view is left alone).
func progressRefused(t *testing.T, pool *pgxpool.Pool, schema string) *pgxpool.Pool {
	t.Helper()
	ctx := testCtx(t)
	qs := pgx.Identifier{schema}.Sanitize()
	for _, stmt := range []string{
		`CREATE FUNCTION ` + qs + `.refuse_progress() RETURNS SETOF pg_catalog.pg_stat_progress_create_index LANGUAGE plpgsql AS
		$$BEGIN RAISE insufficient_privilege USING MESSAGE = 'permission denied for view pg_stat_progress_create_index'; END$$`,
		`CREATE VIEW ` + qs + `.pg_stat_progress_create_index AS SELECT * FROM ` + qs + `.refuse_progress()`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	return configuredPool(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.RuntimeParams["search_path"] = qs + ", pg_catalog" })
}

// configuredPool is a pool on the test database, its config changed by
// configure, closed when the test ends.
func configuredPool(t *testing.T, configure func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(postgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	configure(cfg)
	p, err := pgxpool.NewWithConfig(testCtx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestPostgresIndexesWithoutProgressView: where doctor's user cannot read
// pg_stat_progress_create_index (its SELECT revoked), the indexes are
// still checked: OK when they are, an invalid one reported as invalid
// (whether a build is under way is not known). Before, the view was read
// in the catalog query, whose failure made the whole check an Info "not
// checked".
func TestPostgresIndexesWithoutProgressView(t *testing.T) {
	u, pool, schema := pgURL(t, nil)
	open(t, u) // migrates
	ctx := testCtx(t)
	table := schema + ".jobs"
	qt := pgx.Identifier{schema, "jobs"}.Sanitize()
	refused := progressRefused(t, pool, schema)
	fs, err := doctor.Postgres(ctx, refused, schema, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if f := find(fs, "postgres.indexes", table); len(f) != 1 || f[0].Severity != doctor.OK {
		t.Fatalf("postgres.indexes: %+v; want OK", f)
	}
	const name = "jobs_dead_letter_page_idx"
	if _, err := pool.Exec(ctx, `DROP INDEX `+pgx.Identifier{schema, name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	create := ""
	for _, ix := range postgres.Indexes() {
		if ix.Name == name {
			create = ix.Create(schema)
		}
	}
	finish := buildHeld(t, pool, `INSERT INTO `+qt+` (queue, message_id, payload, max_attempts) VALUES ('q', 'm', '\x00', 1)`,
		create, pgx.Identifier{schema, name}.Sanitize())
	fs, err = doctor.Postgres(ctx, refused, schema, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if f := find(fs, "postgres.indexes", table); len(f) != 1 || strings.Contains(f[0].Summary, "not checked") ||
		!strings.Contains(f[0].Evidence, name+" invalid") {
		t.Errorf("postgres.indexes: %+v; want %s invalid", f, name)
	}
	finish()
}

// TestLedgerIndexesWithoutProgressView: Store.Indexes reads the indexes
// where pg_stat_progress_create_index cannot be read, an invalid one as
// invalid and not known to be building, and leaves a transaction it runs
// in usable. Before, it failed.
func TestLedgerIndexesWithoutProgressView(t *testing.T) {
	_, pool, schema := pgURL(t, nil)
	ctx := testCtx(t)
	store := migratedLedger(t, pool, schema)
	table := schema + ".ledger_jobs"
	refused := progressRefused(t, pool, schema)
	rstore, err := pgledger.New(refused, pgledger.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	fs, err := doctor.Ledger(ctx, rstore, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if f := find(fs, "ledger.indexes", table); len(f) != 1 || f[0].Severity != doctor.OK {
		t.Fatalf("ledger.indexes: %+v; want OK", f)
	}
	const name = "ledger_jobs_first_seen_idx"
	if _, err := pool.Exec(ctx, `DROP INDEX `+pgx.Identifier{schema, name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	ixs, err := store.Indexes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var create string
	for _, ix := range ixs {
		if ix.Name == name {
			create = ix.Create(true)
		}
	}
	finish := buildHeld(t, pool, `INSERT INTO `+store.Table()+` (message_id, status, rank, first_seen_at, updated_at) VALUES ('m', 'enqueued', 0, now(), now())`,
		create, pgx.Identifier{schema, name}.Sanitize())
	tx, err := refused.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	tstore, err := pgledger.New(tx, pgledger.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	ixs, err = tstore.Indexes(ctx)
	if err != nil {
		t.Fatalf("Indexes: %v; want them read without the progress view", err)
	}
	seen := false
	for _, ix := range ixs {
		if ix.Name == name {
			seen = true
			if ix.Found == "" || ix.Valid || ix.Building {
				t.Errorf("%s: %+v; want found, invalid, not known to be building", name, ix)
			}
		}
	}
	if !seen {
		t.Errorf("%s not listed: %+v", name, ixs)
	}
	var one int
	if err := tx.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
		t.Errorf("the transaction after Indexes: %v; want it usable", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	finish()
	fs, err = doctor.Ledger(ctx, rstore, 0, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "ledger.indexes", table, doctor.OK)
}
