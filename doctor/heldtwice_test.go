package doctor_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/doctor"
)

// TestPostgresIndexNameHeldByTwoArchives: a jobs table archived a second
// time (renamed away, as the first one was) takes the indexes' names
// along again, while the names with "_old" are the first archive's. The
// fix renames the holder to a free name ("_old2") and ends OK. Before, it
// renamed it to the name with "_old" again, which fails (the relation
// already exists), for ever.
func TestPostgresIndexNameHeldByTwoArchives(t *testing.T) {
	u, pool, schema := pgURL(t, nil)
	open(t, u) // migrates
	ctx := testCtx(t)
	table := schema + ".jobs"
	b, err := postgres.New(pool, postgres.Options{Schema: schema, DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	for i, archive := range []string{"jobs_2025", "jobs_2026"} {
		if _, err := pool.Exec(ctx, `ALTER TABLE `+pgx.Identifier{schema, "jobs"}.Sanitize()+` RENAME TO `+archive); err != nil {
			t.Fatal(err)
		}
		if err := b.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		fs, err := doctor.Postgres(ctx, pool, schema, 0, doctor.Options{})
		if err != nil {
			t.Fatal(err)
		}
		f := find(fs, "postgres.indexes", table)
		if len(f) != 1 {
			t.Fatalf("postgres.indexes: %+v", f)
		}
		suffix := []string{"_old", "_old2"}[i]
		for _, ix := range postgres.Indexes() {
			rename := `ALTER INDEX ` + pgx.Identifier{schema, ix.Name}.Sanitize() + ` RENAME TO ` + pgx.Identifier{ix.Name + suffix}.Sanitize()
			if !strings.Contains(f[0].Fix, rename) {
				t.Fatalf("%s archived: fix lacks %s: %s", archive, rename, f[0].Fix)
			}
			for _, stmt := range []string{rename, ix.Create(schema)} {
				if _, err := pool.Exec(ctx, stmt); err != nil {
					t.Fatalf("%s archived: %s: %v", archive, stmt, err)
				}
			}
		}
		fs, err = doctor.Postgres(ctx, pool, schema, 0, doctor.Options{})
		if err != nil {
			t.Fatal(err)
		}
		expect(t, fs, "postgres.indexes", table, doctor.OK)
	}
}

// TestLedgerIndexNameHeldByTwoArchives: as
// TestPostgresIndexNameHeldByTwoArchives, for the ledger: Index.Rename
// gives the holder a free name the second time.
func TestLedgerIndexNameHeldByTwoArchives(t *testing.T) {
	_, pool, schema := pgURL(t, nil)
	ctx := testCtx(t)
	store := migratedLedger(t, pool, schema)
	table := schema + ".ledger_jobs"
	for i, archive := range []string{"ledger_jobs_2025", "ledger_jobs_2026"} {
		if _, err := pool.Exec(ctx, `ALTER TABLE `+store.Table()+` RENAME TO `+archive); err != nil {
			t.Fatal(err)
		}
		if err := store.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		ixs, err := store.Indexes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		suffix := []string{"_old", "_old2"}[i]
		for _, ix := range ixs {
			want := `ALTER INDEX ` + pgx.Identifier{schema, ix.Name}.Sanitize() + ` RENAME TO ` + pgx.Identifier{ix.Name + suffix}.Sanitize()
			if ix.HeldBy == "" || ix.Rename() != want {
				t.Fatalf("%s archived: %s held by %q, Rename %s; want %s", archive, ix.Name, ix.HeldBy, ix.Rename(), want)
			}
			for _, stmt := range []string{ix.Rename(), ix.Create(true)} {
				if _, err := pool.Exec(ctx, stmt); err != nil {
					t.Fatalf("%s archived: %s: %v", archive, stmt, err)
				}
			}
		}
		fs, err := doctor.Ledger(ctx, store, 0, doctor.Options{})
		if err != nil {
			t.Fatal(err)
		}
		expect(t, fs, "ledger.indexes", table, doctor.OK)
	}
}
