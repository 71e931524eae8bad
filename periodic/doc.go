// Package periodic publishes periodic jobs: one message per slot of a
// schedule — a cron expression ([Cron], parsed by github.com/robfig/cron/v3)
// or a fixed interval ([Every]) — to any [sdk.Publisher].
//
// # Once in effect with several schedulers
//
// Run a [Scheduler] in several processes for availability: there is no
// leader. Every scheduler publishes every slot, and the slot's message is
// the same everywhere: its IdempotencyKey is [SlotKey] (job name + slot
// time) and its ID [SlotID] (a UUID derived from the key). What stops the
// duplicates depends on the broker:
//
//   - PostgreSQL with Options.DedupeEnqueue: the second insert of a key is
//     dropped; one job per slot is stored (as long as retention keeps the
//     first).
//   - NATS JetStream: the ID is the Nats-Msg-Id; the stream drops copies
//     published within its Duplicates window (2 min by default), which
//     covers schedulers whose clocks agree within it.
//   - SQS FIFO: the key is the MessageDeduplicationId; copies within SQS's
//     5-minute window are dropped.
//   - memory, RabbitMQ, SQS standard: no publish dedupe; each scheduler's
//     copy is delivered, and the consumer's idempotency guard
//     (package idempotency, keyed by Message.IdempotencyKey, the default)
//     runs the job once and acks the copies.
//
// The guard is what makes it once in effect on every broker: keep it on the
// handler even where the broker dedupes, since its windows are bounded.
//
// # Missed slots
//
// A slot is due when the clock passes it. Slots that pass while a scheduler
// cannot publish them — it was paused, Publish kept failing, or the job's
// previous publish is still in flight (each job publishes on its own, so a
// hung one holds up no other job) — are handled by Options.Missed: [Skip]
// publishes only the latest due slot, [CatchUp] the due slots oldest
// first, at most Options.MaxCatchUp. A job's slots are published one at a
// time: Options.OnPublish is called for each as it is published, in
// schedule order, for slots caught up together as for slots that come one
// by one. A scheduler that
// starts publishes nothing older than its start, except with CatchUp and
// Options.Lookback, when the slots of the last Lookback are due at once
// (republishing a slot that other schedulers published is harmless: same
// key). Dropped slots are logged at Warn.
//
// # Time
//
// Slots are computed from the schedule alone, so schedulers agree: [Every]
// aligns to the Unix epoch, and cron expressions are read in UTC unless
// they start with CRON_TZ= and a named zone ("Local", the machine's zone,
// is refused). A scheduler reads the clock at least every minute, so
// slots that come due when the wall clock jumps ahead (a host resumed from
// suspend, a clock stepped) are published within a minute. Tests inject a
// [FakeClock] (Options.Clock) and run hours of schedule without sleeping;
// every time of the scheduler follows the Clock — the slots, the Retry
// delays and Options.PublishTimeout, which an Advance past it makes cut a
// hung publish short.
//
// See ARCHITECTURE.md, "Periodic jobs".
package periodic
