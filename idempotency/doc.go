// Package idempotency gives berth handlers an exactly-once effect on top of
// at-least-once delivery: each job names its business operation with an
// idempotency key (Message.IdempotencyKey, e.g. "charge:order_123:v1"), and a
// result store with a unique constraint on that key decides whether the
// handler runs.
//
// The [Middleware] has two modes:
//
//   - [Transactional] (effects in the same PostgreSQL database): one
//     transaction holds the key row, the handler's own writes (the handler
//     finds the transaction in its context, see pgstore.TxFrom) and the
//     result; it commits, then the handler returns nil and the Worker acks.
//     A crash before commit leaves nothing; a crash after commit makes the
//     redelivery find the key and ack without running the handler; a
//     concurrent duplicate blocks on the uncommitted key and then sees it.
//   - [Lease] (external effects, e.g. a payment API called with the key):
//     the key is claimed in_progress with an expiry, the handler runs outside
//     any transaction, then the result is stored completed. A duplicate that
//     finds the claim in progress is retried later ([sdk.RetryAfter]), never
//     run concurrently and never acked; an expired claim is taken over by
//     exactly one worker; a handler error releases the claim, and so does a
//     claim call that fails (the claim may have been stored with its answer
//     lost: it is released by its owner token). A heartbeat
//     extends the claim for as long as the handler runs, even after its ctx
//     is done (a handler may finish its call and return nil). The handler's
//     ctx is cancelled with [ErrClaimLost] when the claim is taken over or
//     cannot be extended before it expires (with the heartbeat disabled,
//     when it expires).
//
// Lease mode cannot make an external effect atomic with its record: a worker
// that dies after the effect and before the result is stored leaves a claim
// that is taken over when it expires, and the handler runs again. Pass the
// key ([KeyFrom]) to the external API so that it deduplicates that second
// call; the guard does its part by recording a success even after the
// handler's ctx was cancelled and by retrying a failed completion for as
// long as the claim holds.
//
// The same key with a different payload fingerprint is a permanent
// [ErrKeyConflict], never the stored result. A key (or job type) the store
// cannot hold — for pgstore a NUL byte, invalid UTF-8 or a key too long for
// its index — is a permanent [ErrInvalidKey]; a result it cannot hold is
// refused by [SetResult]. A message without a key is
// dead-lettered ([ErrMissingKey]) or falls back to its message ID, as
// configured.
//
// Stores: idempotency/pgstore (PostgreSQL, the source of truth),
// idempotency/memstore (tests and demos), and idempotency/redisstore, a fast
// and lossy dedupe [Cache] consulted first and written only after success:
// losing it never causes a duplicate effect, because the durable store is
// always checked before the handler runs.
//
// [Inbox] applies the same guard to events received from other systems, with
// the event ID as the key. [PurgeExpired] deletes expired results in bounded
// batches. [Stats] counts duplicates suppressed, key conflicts, in-progress
// collisions and lease takeovers; an [Observer] sees the same events.
package idempotency
