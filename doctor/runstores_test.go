package doctor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/ledger"
)

// TestRunStores: without a broker (berth doctor calls RunStores when the
// broker does not answer), the checks of the ledger, the idempotency result
// store and the dedupe cache run as Run runs them, worst first; neither
// the broker's nor the Worker's options are reported, and the
// ledger.duration evidence says the lease was not read, not that the
// broker has none.
func TestRunStores(t *testing.T) {
	ctx := testCtx(t)
	pool := pgPool(t)
	table := resultsTable(t, pool, time.Hour, nil) // kept an hour: idempotency.retention is an error
	rdb := redis.NewClient(&redis.Options{Addr: integration.RedisAddr(t)})
	defer rdb.Close()
	prefix := "berth:doctor:" + suffix() + ":"
	t.Cleanup(func() { rdb.Del(context.Background(), prefix+"a") })
	if err := rdb.Set(ctx, prefix+"a", "x", 0).Err(); err != nil { // no TTL: the cache grows forever
		t.Fatal(err)
	}
	jobs := []ledger.Job{{MessageID: "1", Status: ledger.StatusSucceeded, Duration: time.Second}}
	fs, err := doctor.RunStores(ctx, doctor.Options{Ledger: pagedReader{jobs: jobs}, Results: pool, ResultsTable: table,
		Redis: rdb, RedisPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, fs, "ledger.duration", "", doctor.OK)
	if f := find(fs, "ledger.duration", ""); len(f) != 1 || !strings.Contains(f[0].Evidence, "the broker's lease not read (no broker)") {
		t.Errorf("ledger.duration without a broker: %+v", f)
	}
	expect(t, fs, "idempotency.retention", table, doctor.Error)
	expect(t, fs, "idempotency.dedupe-ttl", prefix+"*", doctor.Warn)
	for _, f := range fs {
		if strings.HasPrefix(f.ID, "worker.") || strings.HasPrefix(f.ID, "broker.") || strings.HasPrefix(f.ID, "postgres.") {
			t.Errorf("a check of the broker or the Worker's options ran without a broker: %+v", f)
		}
	}
	if fs[0].Severity != doctor.Error {
		t.Errorf("not worst first: %s", ids(fs))
	}

	// Nothing set: nothing to check.
	if fs, err := doctor.RunStores(ctx, doctor.Options{}); err != nil || len(fs) != 0 {
		t.Errorf("RunStores without stores: %s, %v", ids(fs), err)
	}
}
