// Package concurrency is berth's toolbox for concurrency control on business
// data: what keeps two workers, or two deliveries of one job, from losing an
// update or moving a status backwards. Its sub-packages:
//
//   - [github.com/berthq/berth/concurrency/rowlock]: SELECT … FOR UPDATE in
//     the caller's transaction, with a bounded wait; busy becomes
//     sdk.RetryAfter; the wait is measured.
//   - [github.com/berthq/berth/concurrency/optimistic]: versioned updates
//     (ErrVersionConflict when the row moved) and a bounded reload-and-retry
//     helper that counts conflicts.
//   - [github.com/berthq/berth/concurrency/state]: a declared transition table
//     enforced by a conditional UPDATE; backward moves are refused
//     permanently, re-applying the current state is a no-op.
//   - [github.com/berthq/berth/concurrency/redislock]: a Redis lock with an
//     owner token, a watchdog and fencing tokens, and a lock middleware.
//   - [github.com/berthq/berth/concurrency/fence]: database writes that check
//     a fencing token.
//
// Priorities (ARCHITECTURE.md, "Layers"): idempotency first (a unique row per
// business operation), then concurrency control in the database (row locks,
// versions, transitions), then optimisations. A Redis lock is an efficiency
// tool, not a correctness tool: it can be lost without its holder noticing.
// Idempotency and the database are what make a job's effect happen once.
//
// Every table and column name these packages put into SQL is validated (a
// plain identifier, optionally schema-qualified for tables) and quoted; values
// are always bind parameters. A missing row is a permanent error (each
// package's ErrNotFound), and so is a value PostgreSQL refuses with a data
// exception (SQLSTATE class 22: a key the key column's type cannot read, a
// value to set of the wrong form), since every retry sends the same values.
// Keys and values often come from messages: in error text a string key is
// quoted with Go escapes, and so is any other key, or a status read from a
// row, whose text needs them; PostgreSQL's message, which repeats a value
// it could not read as it was sent, has its control and bidirectional-text
// characters escaped.
package concurrency
