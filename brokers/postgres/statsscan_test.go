package postgres_test

import (
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// TestStatsReadsNoWholeTable: Stats of a busy queue, and of a declared idle
// one, reads the queue's rows through the indexes, not the whole table
// (counted by PostgreSQL's seq_scan of the jobs table, sequential scans
// being disabled for the reader's sessions so that the planner takes an
// index wherever one serves, as it does on a large table). The counts'
// condition status <> 'completed' matched no index, so every Stats read
// the table, completed rows and all; and the look for an idle queue read
// the jobs table for any row of it even when the queues table had it.
func TestStatsReadsNoWholeTable(t *testing.T) {
	ctx := testCtx(t)
	// A backend writes its table counters when idle, now and then, and when
	// it exits: the pools that set up and read the table are closed, and
	// their sessions gone, before the counters are read (on a pool of its
	// own, which touches no job).
	counters := newPool(t, "berth-statsscan-counters-"+suffix(), 2)
	setupApp := "berth-statsscan-setup-" + suffix()
	setup := newPool(t, setupApp, 4)
	b := newBroker(t, setup, postgres.Options{Schema: freshSchema(t, counters), Lease: time.Minute})
	busy, idle := "statsscan_busy_"+suffix(), "statsscan_idle_"+suffix()
	if err := b.DeclareQueue(ctx, idle); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := b.Publish(ctx, busy, &sdk.Message{Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		if err := b.Publish(ctx, "statsscan_other_"+suffix(), &sdk.Message{Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		ds, err := b.Receive(ctx, busy, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("Receive = %d, %v", len(ds), err)
		}
		switch i {
		case 0:
			err = ds[0].Ack(ctx)
		case 1:
			err = ds[0].DeadLetter(ctx, errors.New("x"))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	ended := func(app string) {
		t.Helper()
		for {
			var n int
			if err := counters.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("the sessions of %s did not end", app)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	schema := b.Schema()
	_ = b.Close()
	setup.Close()
	ended(setupApp)
	scans := func() (seq, idx int64) {
		t.Helper()
		// Each read is its own transaction: a fresh snapshot of the counters.
		if err := counters.QueryRow(ctx, `SELECT seq_scan, COALESCE(idx_scan, 0) FROM pg_stat_user_tables WHERE relid = $1::regclass`,
			schema+".jobs").Scan(&seq, &idx); err != nil {
			t.Fatal(err)
		}
		return seq, idx
	}
	app := "berth-statsscan-reader-" + suffix()
	reader := newPoolWith(t, app, 2, map[string]string{"enable_seqscan": "off"})
	r, err := postgres.New(reader, postgres.Options{Schema: schema, DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	seq0, idx0 := scans()
	for range 3 {
		s, err := r.Stats(ctx, busy)
		if err != nil || s.Ready+s.InFlight != 1 || s.DeadLettered != 1 {
			t.Fatalf("Stats(busy) = %+v, %v; want one in flight (or ready) and one dead letter", s, err)
		}
		if s, err := r.Stats(ctx, idle); err != nil || s != (sdk.QueueStats{Queue: idle}) {
			t.Fatalf("Stats(idle) = %+v, %v; want an empty queue", s, err)
		}
	}
	_ = r.Close()
	reader.Close()
	ended(app)
	seq1, idx1 := scans()
	if seq1+idx1 <= seq0+idx0 {
		t.Fatalf("scans %d then %d: the reader's counters were not written", seq0+idx0, seq1+idx1)
	}
	if seq1 != seq0 {
		t.Errorf("Stats read the whole jobs table %d times (6 calls)", seq1-seq0)
	}
}
