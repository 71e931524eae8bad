package pgschema_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berthq/berth/berthtest/pgtest"
	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/idempotency/pgstore"
	"github.com/berthq/berth/ledger/pgledger"
	"github.com/berthq/berth/outbox"
	"github.com/berthq/berth/pause"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestMigrationsShareOneSchema: the migrations of the broker, the
// idempotency store, the ledger, the outbox and the pause table, all run at
// once on a schema that does not exist yet (a first deployment whose
// services start together), all succeed. Each serialised its own runs with
// an advisory lock of its own, but all create the same schema ("berth" by
// default), and CREATE SCHEMA IF NOT EXISTS fails with a unique violation
// (pg_namespace_nspname_index, SQLSTATE 23505) when another session
// creates it meanwhile: one of them failed at random.
func TestMigrationsShareOneSchema(t *testing.T) {
	pool, base := pgtest.Schema(t, 16)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for round := range 10 {
		schema := base + "_" + pgtest.Suffix()
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) })
		br, err := postgres.New(pool, postgres.Options{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		ob, err := outbox.New(pool, outbox.Options{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		lg, err := pgledger.New(pool, pgledger.Options{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		st, err := pgstore.New(pool, pgstore.Options{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		ps, err := pause.NewPG(pool, pause.PGOptions{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		migrations := map[string]func(context.Context) error{
			"broker": br.Migrate, "outbox": ob.Migrate, "ledger": lg.Migrate, "idempotency": st.Migrate, "pause": ps.Migrate,
		}
		var wg sync.WaitGroup
		errs := make(chan string, 2*len(migrations))
		for range 2 {
			for name, migrate := range migrations {
				wg.Go(func() {
					if err := migrate(ctx); err != nil {
						errs <- name + ": " + err.Error()
					}
				})
			}
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Errorf("round %d: %s", round, e)
		}
		_ = br.Close()
		if t.Failed() {
			return
		}
	}
}
