// Package ledger keeps the state of every job — status, attempts, last error
// and its class, next attempt, who ran it and for how long — queryable on
// every broker: "what happened to order 123's charge job?", "which jobs are
// retrying right now and why?", "how many failed in the last hour, and with
// which error?".
//
// On RabbitMQ, SQS and the memory broker a job's state exists nowhere once
// the message is in flight, so the ledger records it as it happens, without
// touching handlers:
//
//   - [Ledger.Publisher] wraps any [sdk.Publisher] (a broker, the outbox
//     relay's publisher, a telemetry publisher) and records `enqueued`; it
//     keeps the broker's asynchronous publish ([sdk.AsyncPublisher]),
//     recording a message once the broker confirms it;
//   - the [Ledger] itself is an [sdk.Observer]: put it in
//     WorkerOptions.Observers (beside telemetry's) and it records each
//     attempt's start and settlement (an [sdk.LongDelay] hop, a delivery
//     acked before its sdk.HeaderDueAt, is no attempt: it is recorded as
//     the job enqueued, due at that time);
//   - [Ledger.DeadLetters] wraps a broker's dead-letter API and records
//     `redriven` for the jobs it redrives by ID (a whole-queue redrive
//     shows when each job starts again).
//
// Recording never blocks a job for long and never fails it: events go into a
// bounded buffer that one goroutine writes to the [Store] in batches (one
// round trip per batch). When the buffer is full, recording waits at most
// Options.BlockTimeout (a Publish of a batch: at most that in all, not per
// message), then drops the event and counts it
// ([Stats].Dropped, the berth.ledger.events metric with
// berth.ledger.result=dropped). A failed batch is counted and logged (the
// first of a run of failures, then once a minute while they go on); the
// jobs it described go on as if nothing happened. A later event of the same
// job repairs a lost one (the row holds the newest state, not a log).
//
// A job is one row, keyed by its message ID; the hops of a job delayed by
// [sdk.LongDelay], new messages with new IDs, carry its first message's ID
// in sdk.HeaderHopOf, and their events go to that row.
//
// Out-of-order writes never move a row backwards: each event carries its
// (redrive generation, attempt, start, status rank, time), and the store
// applies it only when it is newer than the row, in SQL, so two processes
// writing about one job agree whatever the order their batches land in.
// Within one attempt `succeeded` and `dead` are final. One attempt may have
// several deliveries — a release spends no attempt, and on a RabbitMQ
// classic queue a redelivery after a lost lease keeps its attempt (only the
// redelivered flag says it came back) — and every event of one delivery
// carries the start its `running` recorded: of two deliveries of an
// attempt, the one that started later wins, so an earlier delivery's
// `retrying` (a lost lease) or `released`, however late it is reported,
// never hides the delivery running now. Within one delivery, events order
// by rank, then time (a release is dated when its handler ended, after its
// own start).
//
// The PostgreSQL store ([github.com/berthq/berth/ledger/pgledger]) keeps one
// row per job, whose history holds every earlier attempt's outcome,
// including one that a crashed worker never settled (a job that succeeds at
// its first attempt writes no history). On
// the PostgreSQL broker the jobs table already is the ledger: pgledger.Jobs
// reads it through the same [Reader] API, and nothing is written twice.
//
// Attempts that end without a settlement are recorded too: a lost lease
// and a settlement whose call failed (an ack on a dropped connection) show
// as `retrying` with no next attempt time and the class
// [ClassLeaseLost] or [ClassSettleFailed]: the broker delivers the message
// again, and that attempt replaces them. A release whose call failed shows
// as `released`, class [ClassSettleFailed], with no next attempt time: a
// release spends no attempt, and the broker may deliver the message again
// at the same attempt, whose start replaces it.
//
// A broker's own dead-lettering of a message that crashes every consumer
// or keeps losing its lease (the memory broker's and RabbitMQ's delivery
// limit, SQS's redrive policy, JetStream's max deliveries) happens without
// a Worker: [Ledger.SyncDeadLetters] reads the dead-letter queue and
// records those jobs `dead` with the broker's reason (class
// max_deliveries). [RunJanitor] runs it periodically, and purges finished
// jobs past their retention in bounded batches. A redrive made without
// [Ledger.DeadLetters] shows only when the message is delivered again.
//
// A job whose message leaves the broker without berth seeing it end (a
// queue purge, a broker's TTL or length limit, a dead letter nobody syncs)
// never reaches a final state: its row would stay enqueued, running,
// retrying, released or redriven forever. The janitor deletes such rows
// once nothing happened to them for JanitorOptions.StaleRetention (default
// [DefaultStaleRetentionFactor] × Retention, 28 days; negative keeps them),
// counted from when their next attempt is due when that is later
// ([StalePurger], pgledger.Store's PurgeStale): a retry's or release's
// delay, and a delayed publish's — [Ledger.Publisher] records an enqueued
// job's due time (its Delay, or a later sdk.HeaderDueAt of
// [sdk.LongDelay]). A job alive after all (backlogged in its queue, or its
// handler running, longer than that without an event) starts a new row at
// its next event, without its earlier states.
package ledger
