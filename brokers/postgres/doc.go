// Package postgres is a berth broker on a PostgreSQL job table: the jobs, their
// attempts, errors and dead letters live in your own database, queryable with
// SQL, and a job can be enqueued in the same transaction as the business change
// that calls for it.
//
// The table is the reference jobs table of ARCHITECTURE.md ("Reference schema
// and the billing scenario") (id, job_type, payload_json,
// status, attempt_count, max_attempts, available_at, visibility_until,
// worker_id, idempotency_key, last_error, created_at, updated_at) plus queue,
// headers, lease_token and the message fields. [Broker.Migrate] creates it;
// [SchemaSQL] (and the embedded schema.sql) is the same DDL for teams who apply
// migrations themselves. The body is stored byte for byte in payload (bytea);
// payload_json holds a copy when the body is valid JSON in valid UTF-8 with no
// \u0000 or surrogate escape (what PostgreSQL can turn into text and jsonb), for
// SQL, and is NULL otherwise: any body, JSON-looking or not, is published.
// headers holds a JSON object of strings; in a row written by hand, a value
// that is not a string is delivered (and listed) as its JSON text, and
// headers that are not an object are dropped with a warning, so that such a
// row is still delivered, and can be dead-lettered, instead of failing the
// claim of every job taken with it.
//
// How the table keeps the [sdk.Delivery] contract:
//
//	claim       UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED LIMIT max): due queued/retry rows
//	            and processing rows whose lease expired become processing, attempt_count+1,
//	            visibility_until = clock_timestamp()+Lease (from when the row is taken, not
//	            from a start the claim may have waited after), worker_id, a fresh lease_token (one per
//	            claim, chosen by the broker before it sends the claim)
//	poison      a row claimed max_attempts times is dead-lettered at the next claim (sdk.ErrMaxDeliveries)
//	Ack         status = 'completed', group-committed (see below)
//	Retry(d)    status = 'retry', available_at = now()+d, last_error
//	Release(d)  back to queued/retry with attempt_count-1: no attempt consumed
//	DeadLetter  status = 'dead_letter', last_error, the sdk.AnnotateDeadLetter headers
//	            (a NUL byte a handler put in a header is written as U+FFFD)
//	ExtendLease visibility_until = clock_timestamp()+d, d at most Broker.MaxLease (12 h, or Lease when longer)
//
// Every settlement is fenced by the lease token: it changes the row only if the
// token still matches, so a worker whose lease expired and was taken over
// changes nothing and gets an error wrapping [sdk.ErrLeaseLost]. While a row
// is processing, available_at equals visibility_until, so one partial index on
// (queue, available_at) serves both new work and expired leases.
//
// A claim whose reply is lost with its connection (reset after the
// statement was sent, or the session ended by a FATAL server error, which
// may come after the commit) may have been committed by the server: Receive
// returns an error wrapping [sdk.ErrUnavailable], and the broker hands that
// claim's rows back in the background, on another connection, found by the
// claim's lease token — ready at once, no attempt counted — instead of
// leaving them leased to nobody for a whole lease. It looks until the
// claim's server process is gone (a claim still running when the
// connection broke, or one still on its way to the server, may commit
// after; an idle process is no proof), for at most the lease or 30 s;
// Close lets a hand-back under way finish, for up to 5 s, before it
// returns (so the application may close the pool or exit after Close),
// and one whose claim failed after Close began is not run. Rows it cannot
// hand back are logged and come back after their lease.
//
// A claimed row the broker cannot decode (a value written by hand or by
// another tool that its Go types cannot hold, such as a first_failure_at
// of 'infinity') does not fail the claim: the rows that decode are
// delivered, and that one is handed back at once, no attempt counted, with
// a warning naming its job id. A Receive whose claim took only such rows
// returns a [*DecodeError] with their ids: fix the rows (or dead-letter or
// delete them) in SQL. So is a row at its attempt cap whose message ID is
// too long for an entry of the dead letters' index (2704 bytes with the
// queue name, compressed when it compresses; written by hand, by another
// tool, or before Publish bounded IDs to [MaxIndexedLength]):
// dead-lettering it would fail every claim of its queue.
//
// After Close, and once the application has closed the pool (even with
// the broker open), every operation returns an error wrapping
// [sdk.ErrClosed], not [sdk.ErrUnavailable]: nothing comes from a closed
// pool again, and a Worker stops on ErrClosed where it would retry an
// unavailable broker for ever. The broker's own loops stop too, each
// logging it once: the retention loop, and the LISTEN connection, which is
// closed and not made again (the listener checks the pool before each
// connect, when the connection fails, and every 5 s while it listens).
// Settle or release deliveries (stop the Worker) before Close: Release,
// like every settlement, is refused after it, and an unsettled job comes
// back after its lease.
//
// Acks are group-committed: the broker's acker goroutine writes every ack
// made while its previous statement ran in one UPDATE (one commit), each row
// still matched by its own lease token, and tells each ack its own outcome —
// done, or [sdk.ErrLeaseLost] when another claim took that job meanwhile
// (its row is left to the new holder, even when both acks share the
// statement). A lone ack is written at once: the batch grows with the load,
// without a linger. The statement is repeated on a lost connection (it is
// idempotent). Deliveries implement [sdk.AsyncAcker]: the Worker acks
// successful jobs with AckAsync, so a handler goroutine takes the next job
// while the ack waits for its batch, the delivery keeping its slot, and its
// lease (ExtendLease works while the ack is in flight), until the outcome is
// back (Concurrency + Prefetch bound the jobs in flight, and so each batch). An ack is only delayed, never written for unfinished work; a
// process that dies before the batch commits leaves its jobs processing, and
// they are claimed again after their lease (the idempotency guard absorbs
// the second run). Ack itself waits for the outcome. For many short jobs,
// give the Worker a Prefetch of a few hundred: a claim of ~100 then
// overlaps the commit of the previous batch's acks (BENCHMARKS.md).
//
// Receive waits on LISTEN/NOTIFY (one dedicated connection per broker, owned
// by it and closed by Close), wakes at the due time of the earliest delayed
// job or lease (Publish, Retry and Release notify for delayed jobs too, one
// NOTIFY per statement, so a Receive already asleep recomputes its sleep),
// and polls every Options.PollInterval as a fallback; it never busy-loops.
// A lost LISTEN connection is made again after 50 ms, doubling up to 5 s at
// each loss; the delay starts over only after a connection that delivered a
// notification or stayed up 10 s, so a server that accepts the LISTEN and
// drops the connection at once is not reconnected to every 50 ms. The
// LISTEN session turns idle_session_timeout off for itself: it is idle by
// design, and a timeout set for the role or the database would end it at
// every period. A pooled connection that timeout ended (57P05) is a lost
// connection: the acker's statement is repeated on another.
// Due times are on the database server's clock: now() (the statement's
// start) plus the delay, and for [Broker.PublishTx] statement_timestamp()
// plus the delay, so a delay counts from the publish, not from the start of
// the caller's transaction. So are the failure times of the dead-letter
// headers (the last failure is the row's updated_at), whoever dead-letters.
//
// Deliveries also have a JobID() int64 method (the row's id), reachable with
// a type assertion to interface{ JobID() int64 }, to join the jobs table with
// your own tables in SQL.
//
// Every method taking a queue name validates it first, as Publish and
// Receive do ([sdk.ValidateQueueName]): an invalid name (one holding a NUL
// byte, which PostgreSQL text cannot hold, among others) is refused with an
// error wrapping [sdk.ErrInvalidQueue] and no statement is sent.
//
// Status 'failed' is in the reference schema's check constraint but berth
// never writes it: a job that cannot succeed is 'dead_letter'.
package postgres
