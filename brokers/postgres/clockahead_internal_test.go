package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestDeadLetterForeignFirstFailureHostClockAhead: a job that never failed
// before carries a berth-first-failure from outside berth that is a time
// after the database server's now but before the application host's (a host
// clock ahead of the server's). DeadLetter checked the header on the host's
// clock only, took it as a first failure already known, and kept it: the
// dead letter's first failure came after its last (the statement's now()).
// The server's clock decides, as for the last failure.
func TestDeadLetterForeignFirstFailureHostClockAhead(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b, pool := internalBroker(t, ctx, Options{Lease: time.Minute, PollInterval: 20 * time.Millisecond, DisableListen: true})
	b.now = func() time.Time { return time.Now().Add(2 * time.Hour) } // the host's clock, ahead
	q := "clockahead"
	m := &sdk.Message{Body: []byte("x")}
	if err := b.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	// Another tool's header: an hour after the server's now.
	if _, err := pool.Exec(ctx, `UPDATE `+b.table+` SET headers = jsonb_build_object($2::text,
		to_char((now() + interval '1 hour') AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')) WHERE message_id = $1`,
		m.ID, sdk.HeaderFirstFailure); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive = %d, %v", len(ds), err)
	}
	if err := ds[0].DeadLetter(ctx, errors.New("boom")); err != nil {
		t.Fatal(err)
	}
	var first, last string
	if err := pool.QueryRow(ctx, `SELECT headers->>$2, headers->>$3 FROM `+b.table+` WHERE message_id = $1`,
		m.ID, sdk.HeaderFirstFailure, sdk.HeaderLastFailure).Scan(&first, &last); err != nil {
		t.Fatal(err)
	}
	firstAt, err1 := time.Parse(time.RFC3339Nano, first)
	lastAt, err2 := time.Parse(time.RFC3339Nano, last)
	if err1 != nil || err2 != nil {
		t.Fatalf("first %q (%v), last %q (%v)", first, err1, last, err2)
	}
	if firstAt.After(lastAt) {
		t.Errorf("first failure %s after the last %s", first, last)
	}
}
