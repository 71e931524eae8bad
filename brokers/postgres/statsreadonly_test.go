package postgres_test

import (
	"testing"
	"time"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

// TestStatsOnReadOnlySession: Stats is a read. On a session that cannot
// write (a monitoring role's default_transaction_read_only, a hot standby),
// it reports a queue that holds only completed jobs, and was never
// declared, as the empty queue it is. Stats recorded such a queue in the
// queues table as it found it, and failed when that INSERT was refused
// (SQLSTATE 25006), so the dashboard and doctor could not read it.
func TestStatsOnReadOnlySession(t *testing.T) {
	pool := newPool(t, "berth-stats-ro-"+suffix(), 4)
	b := newBroker(t, pool, postgres.Options{Lease: time.Minute, PollInterval: 20 * time.Millisecond})
	ctx := testCtx(t)
	q := "statsro_" + suffix()
	if err := b.Publish(ctx, q, &sdk.Message{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	d := receiveN(t, b, q, 1)[0]
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}

	ro := newPoolWith(t, "berth-statsreadonly-ro", 2, map[string]string{"default_transaction_read_only": "on"})
	reader, err := postgres.New(ro, postgres.Options{Schema: b.Schema(), DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reader.Close() })
	for range 2 {
		s, err := reader.Stats(ctx, q)
		if err != nil {
			t.Fatalf("Stats on a read-only session: %v", err)
		}
		if s.Ready+s.Delayed+s.InFlight+s.DeadLettered != 0 {
			t.Errorf("Stats = %+v, want an empty queue", s)
		}
	}
	if _, err := reader.Stats(ctx, "never_"+suffix()); err == nil {
		t.Error("Stats of an unknown queue on a read-only session: no error, want ErrNotFound")
	}
}
