package postgres

// AckStats reports how many completion statements the broker's acker ran and
// how many acks they carried (read by the benchmark).
func (b *Broker) AckStats() (flushes, acks int64) { return b.acks.flushes.Load(), b.acks.rows.Load() }

// SetUnbatchedAcks makes every Ack its own statement, bypassing the acker's
// batching (the benchmark's baseline).
func (b *Broker) SetUnbatchedAcks(on bool) { b.acks.unbatched.Store(on) }
