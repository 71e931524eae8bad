package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestNextDueFarFutureRow: a job parked in SQL at 'infinity' or centuries
// ahead (a common way to hold one back) is a due time beyond the poll
// interval. nextDue failed on 'infinity' ("cannot subtract infinite
// timestamps": every Receive of the queue returned the error), and for a
// date past 2262 its microseconds overflowed time.Duration to a negative
// wait: Receive looked at the table every minWait instead of every
// PollInterval. A row at '-infinity' is due now.
func TestNextDueFarFutureRow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b, pool := internalBroker(t, ctx, Options{PollInterval: 700 * time.Millisecond, DisableListen: true})
	if err := b.Publish(ctx, "q", &sdk.Message{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	for at, want := range map[string]time.Duration{
		"infinity":   700 * time.Millisecond,
		"2500-01-01": 700 * time.Millisecond,
		"-infinity":  minWait,
	} {
		if _, err := pool.Exec(ctx, `UPDATE `+b.table+` SET available_at = $1::timestamptz`, at); err != nil {
			t.Fatal(err)
		}
		got, err := b.nextDue(ctx, "q")
		if err != nil || got != want {
			t.Errorf("nextDue with a job at %s = %s, %v; want %s", at, got, err, want)
		}
	}
}
