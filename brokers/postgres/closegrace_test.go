package postgres_test

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// TestCloseFinishesLostClaimHandBack: Close, called while the broker hands
// back the rows of a claim whose reply was lost (it waits for the claim's
// server process, still running the claim, to finish), lets that hand-back
// finish before it returns: once Close has returned, the application may
// close its pool or exit, and the rows are claimable at once with no
// attempt counted. The old Close cut the hand-back short and only logged
// it: the rows stayed leased to nobody for the whole lease (ten minutes
// here), an attempt spent.
func TestCloseFinishesLostClaimHandBack(t *testing.T) {
	cfg, proxy := pgProxiedConfig(t)
	app := "berth-close-grace-" + suffix()
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	ctx := testCtx(t)
	proxied, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxied.Close)
	admin := newPool(t, "berth-close-grace-admin-"+suffix(), 2)
	logs := newLogRecorder()
	b := newBroker(t, proxied, postgres.Options{Schema: freshSchema(t, admin), Lease: 10 * time.Minute,
		PollInterval: 100 * time.Millisecond, Logger: slog.New(logs)})
	q := "closegrace_" + suffix()
	const n = 3
	publishN(t, b, q, n)
	// A claim (rows becoming 'processing') sleeps before it commits, well
	// within Close's grace (5 s); the hand-back does not.
	slowClaims(ctx, t, admin, b.Schema(), 1)
	done := make(chan error, 1)
	go func() {
		ds, err := b.Receive(ctx, q, n)
		if len(ds) > 0 {
			err = errors.New("got deliveries")
		}
		done <- err
	}()
	var pid int64
	for { // the claim sleeps in its trigger, uncommitted
		err := admin.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event = 'PgSleep'`, app).Scan(&pid)
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the claim never ran")
		case <-time.After(10 * time.Millisecond):
		}
	}
	proxy.reset(true)
	if err := <-done; !errors.Is(err, sdk.ErrUnavailable) {
		t.Fatalf("Receive whose claim's connection was lost: %v, want ErrUnavailable", err)
	}
	// The hand-back now waits for the claim to finish: close the broker,
	// then the pool, as an application that stops does.
	_ = b.Close()
	proxied.Close()
	// Look once the claim's server process has finished (committed): the
	// rows are then either handed back or leased to nobody.
	for {
		var running bool
		if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE pid = $1 AND state IS DISTINCT FROM 'idle')`, pid).Scan(&running); err != nil {
			t.Fatal(err)
		}
		if !running {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the claim never finished")
		case <-time.After(10 * time.Millisecond):
		}
	}
	requireAllBack(ctx, t, admin, b.Schema(), q, n, "Close")
	if recs, _ := logs.matching(handedBackLog); len(recs) != 1 || attr(recs[0], "jobs").Int64() != n {
		t.Errorf("hand-back logs: %v, want one with jobs=%d", recs, n)
	}
}
