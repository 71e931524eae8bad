package postgres

import (
	"fmt"
	"sync"
	"time"
)

// AckStats reports how many completion statements the broker's acker ran and
// how many acks they carried (read by the benchmark).
func (b *Broker) AckStats() (flushes, acks int64) { return b.acks.flushes.Load(), b.acks.rows.Load() }

// SetUnbatchedAcks makes every Ack its own statement, bypassing the acker's
// batching (the benchmark's baseline).
func (b *Broker) SetUnbatchedAcks(on bool) { b.acks.unbatched.Store(on) }

// HoldAcks keeps the acker from writing any batch until release is called:
// acks made meanwhile stay pending (PendingAcks counts them), so a test can
// put several in one batch, or kill the process before it is written.
func (b *Broker) HoldAcks() (release func()) {
	b.acks.hold.Lock()
	var once sync.Once
	return func() { once.Do(b.acks.hold.Unlock) }
}

// PendingAcks is how many acks wait for the acker's next statement.
func (b *Broker) PendingAcks() int { return b.acks.pendingCount() }

// SetInternalTimeouts shortens the broker's own time limits: claim bounds a
// claim (and the hand-back of rows claimed for a caller that left), ack one
// flush of the acker. Call it before the broker is used.
func (b *Broker) SetInternalTimeouts(claim, ack time.Duration) {
	b.claimTimeout, b.ackTimeout = claim, ack
}

// DeadLetterPageSQL is the statement of DeadLetterPage and
// DeadLetterPageTo (parameters: queue, limit, then the cursor's time and
// id with cursor, then the mark's with mark), for a test to EXPLAIN.
func (b *Broker) DeadLetterPageSQL(cursor, mark bool) string {
	return b.deadLetterPageSQL(cursor, mark)
}

// RFC3339SQL is the SQL that writes the timestamptz expr as a failure-time
// header.
func RFC3339SQL(expr string) string { return fmt.Sprintf(rfc3339SQL, expr) }
