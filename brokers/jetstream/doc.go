// Package jetstream is the berth broker for NATS JetStream, built on
// github.com/nats-io/nats.go and its jetstream package. It needs a NATS
// server with JetStream enabled (nats-server -js); it is tested on 2.9.
//
//	b, err := jetstream.Connect(ctx, "nats://127.0.0.1:4222", jetstream.ConnectOptions{},
//		jetstream.Options{AckWait: time.Minute})
//	if err != nil { ... }
//	defer b.Close()
//	if err := b.DeclareQueue(ctx, "billing"); err != nil { ... } // streams and consumers
//	err = b.Publish(ctx, "billing", &sdk.Message{Type: "billing.charge", Body: body})
//	w, err := sdk.NewWorker(b, handler, sdk.WorkerOptions{Queue: "billing", Lease: time.Minute})
//
// [Connect] owns its connection (reconnecting for ever, with TLS, .creds,
// NKey, user/password or token from [ConnectOptions]); [New] runs on an
// application's *nats.Conn and leaves it open on Close.
//
// # Topology
//
// Queue q is one stream, BERTH_Q_q (work-queue retention), with two
// subjects: berth.q.q (ready) and berth.d.q (delayed), each read by one
// durable pull consumer ("berth" and "berth-delay") that every Broker on the
// queue shares. Dead letters live in a second stream, BERTH_DLQ_q (limits
// retention), one subject per message: berth.dlq.q.<id>. Queue names are
// escaped into stream names and subject tokens one to one ('_' → "__",
// '.' → "_D"). Publish and Receive declare a queue on first use. A
// declaration that creates a consumer or lengthens an AckWait or a dedupe
// window does so under a lock shared by the queue's Brokers: JetStream's
// updates are unconditional, and concurrent declarations would otherwise
// overwrite each other's. The lock is a message in a memory stream,
// BERTH_LOCK_q (subject berth.lock.q), created on first need and kept
// (DeleteQueue deletes it): a declaration takes it by publishing its token
// there with Nats-Expected-Last-Sequence set to the last sequence of the
// stream it read empty, so of several that find it free exactly one stores
// its message, and it releases the lock by deleting that message (by its
// sequence). One left by a process that died expires after 30 s (the
// stream's MaxAge), on the server's clock. Close waits for the
// declarations under way, cut short, to release it. A declaration that
// finds everything as it needs takes no lock and writes nothing. Brokers
// of a berth that made the lock a stream of its own (deleted to release
// it) do not exclude this one's declarations, nor it theirs: upgrade the
// Brokers of a queue together, or let declarations of a queue not overlap
// meanwhile (a lock stream of theirs found by this berth is converted).
//
// # Permissions
//
// A NATS user whose Brokers declare queues needs, besides the JetStream
// API of the queue's streams, for the lock streams (Prefix BERTH shown;
// the queue's escaped name for *): publish on berth.lock.* (taking the
// lock), and publish to $JS.API.STREAM.INFO.BERTH_LOCK_*,
// $JS.API.STREAM.CREATE.BERTH_LOCK_* (first need),
// $JS.API.STREAM.MSG.GET.BERTH_LOCK_* and
// $JS.API.STREAM.MSG.DELETE.BERTH_LOCK_* (release),
// $JS.API.STREAM.UPDATE.BERTH_LOCK_* (converting an earlier berth's lock
// stream) and, for DeleteQueue, $JS.API.STREAM.DELETE.BERTH_LOCK_*; and to
// subscribe to its inboxes (_INBOX.>, or its custom inbox prefix) for the
// answers. Without them a declaration that needs the lock retries it, each
// attempt spaced as when the lock is held, and fails when its ctx ends (or
// after 30 s of failures), naming the last one. A user whose Brokers run
// with [Options.NoDeclare] needs none of them.
//
// # How the berth contract maps onto JetStream
//
//   - Publish sends every message asynchronously (pipelined, at most
//     [Options.MaxInFlight] acks outstanding) and returns when JetStream has
//     acked them all. The message ID is the Nats-Msg-Id, so a retried Publish
//     stores nothing twice within the dedupe window ([Options.Duplicates]).
//   - Every Message field and header travels in one NATS header,
//     Berth-Message, as JSON (an envelope like the SQS broker's attribute):
//     JSON escapes CR, LF and control characters, so any header berth
//     accepts fits (a correlation ID equal to the message ID is left out
//     and restored on receive); the body is the NATS payload as it is. Messages from
//     other producers (no Berth-Message) are delivered with their
//     Nats-Msg-Id (else, or when it is not UTF-8, stream:sequence:stored,
//     stored being the store time in Unix nanoseconds) as ID and
//     their headers (first values) as headers; every copy berth stores of
//     one (Release, dead letter, redrive) keeps its NATS headers as they
//     were, every value and byte.
//   - Receive pulls (a no_wait pull of max, else a long poll for one for up
//     to [Options.WaitTime], then a no_wait pull for the rest). Attempt() is
//     JetStream's NumDelivered, which counts naks and expired AckWaits alike.
//   - The lease is the consumer's AckWait ([Options.AckWait]). ExtendLease
//     sends InProgress (+WPI), which restarts the AckWait; a longer lease is
//     kept by repeating it. berth keeps its own clock of the lease (AckWait
//     from the message's arrival, less a small margin) and refuses to settle
//     once it is over ([*LeaseLostError], [sdk.ErrLeaseLost]): JetStream
//     itself would accept a late ack from the first holder of a message it
//     has redelivered, and apply it to the second holder's delivery. A
//     settlement or ExtendLease that JetStream has not answered by the
//     lease's end is reported so too (it may or may not have been
//     applied), and Release and DeadLetter do not ack the original once
//     the lease has ended while their copy was being stored (DeadLetter
//     then deletes its copy from the dead-letter stream again: the job is
//     back in the queue, or already runs on another consumer). That clock
//     holds only while the consumer's AckWait is no shorter than the
//     Broker's: declaring a queue never shortens it
//     (Brokers of a queue with different AckWaits leave it at the longest,
//     also when they declare it at the same time),
//     and with [Options.NoDeclare] Receive refuses a shorter one
//     ([*AckWaitError]).
//   - Every settlement (+ACK, -NAK, +WPI) is sent as a request and waits for
//     JetStream's answer (a "double ack"): a settlement only buffered by
//     nats.go is lost when the connection drops, and the message would come
//     back although its Ack returned nil. [Options.AsyncAck] trades that
//     for speed when one goroutine settles messages one by one. Retry(d) is a nak with delay d (NakWithDelay): JetStream holds the message back on
//     the server, and the next delivery counts one more attempt. JetStream
//     keeps no cause with a nak, so a dead letter's berth-first-failure is
//     the time it was dead-lettered.
//   - Release (RetryAfter, shutdown): JetStream counts every delivery and
//     cannot give one back, so a nak would consume an attempt. berth stores
//     a new copy whose first delivery counts as the released delivery's
//     attempt (the envelope's base attempt), waits for its publish ack, then
//     acks the original. Were that ack lost, both copies are delivered; the
//     idempotency key dedupes them.
//   - Delays: nats-server before 2.12 has no delayed delivery. A message with
//     a Delay (and a delayed Release) is stored on the delayed subject with
//     its due time. Each Broker that receives from the queue runs one mover
//     goroutine, which naks every message not yet due with the time left
//     (JetStream holds it back that long) and, when it is due, stores it on
//     the ready subject and acks it. Deliveries on the delayed subject are
//     not attempts. A delayed message becomes ready only while some Broker
//     receives from its queue, and due times are compared with the movers'
//     clocks.
//   - DeadLetter stores a copy with berth's reason headers
//     ([sdk.AnnotateDeadLetter]) in the dead-letter stream, waits for its
//     ack, then acks the original. When the lease ran out while the copy
//     was being stored, it does not ack the original, deletes the copy (by
//     the stream sequence of its publish ack) and returns
//     [*LeaseLostError]; a copy it cannot delete is named in the error and
//     logged. A copy dropped as a duplicate of an earlier dead letter of
//     the message that is no longer there is stored again. A copy over the server's max_payload
//     has its annotations shortened, never the message: the reason cut,
//     else every annotation left out, and [HeaderDeadLetterTruncated]
//     says so. Publish refuses ([sdk.MessageTooLargeError]) a message
//     without room left for the shortest such copy, and for a release or
//     a redrive (a few hundred bytes below max_payload), so that every
//     message it accepts can be dead-lettered; only a foreign message too
//     close to max_payload cannot, and stays in the queue (DeadLetter
//     returns the MessageTooLargeError).
//   - Poison messages: berth does not use the consumer's MaxDeliver and its
//     advisory. The advisory is a core-NATS event, lost when no process
//     listens at that moment, and the message would stay in the work queue,
//     never delivered again. Instead Receive checks NumDelivered: a message
//     delivered more than [Options.MaxDeliveries] times is not handed out
//     but dead-lettered with the cause [sdk.ErrMaxDeliveries] (class
//     "poison"). The check needs one more delivery, which happens on the
//     next Receive after the last lease ran out.
//   - A Receive whose context ends during its long poll (or while the
//     answer to a no_wait pull arrives) returns at once.
//     The pull request stays open on the server until it expires; a message
//     it still delivers is handed back like a Release, without consuming an
//     attempt, by a goroutine the Broker owns (stopped by Close). A Receive
//     that Close interrupts returns [sdk.ErrClosed] and hands back likewise
//     what its pull read or still had on its way; Close waits for that.
//     A pull request still open at Close is not simply unsubscribed: its
//     subscription is drained (UNSUB, then a round trip to the server, at
//     most 2 s), so that a message the server delivers to it before it
//     drops the subscription is handed back too rather than lost to
//     nats.go and redelivered after its AckWait, an attempt spent.
//
// A server defect to know of: on nats-server 2.9.10 (the version berth is
// tested on) a redelivery that falls due at the moment a waiting pull
// request expires can be lost, and the message's NumDelivered then starts
// again at 1, so its Attempt() too. Back-to-back empty long polls of
// WaitTime each line up with a redelivery AckWait later when WaitTime divides
// AckWait, so pick a WaitTime that does not (the defaults, 7 s and 30 s,
// do not); newer servers were not tried here.
//
// # Inspection and dead letters
//
// [Broker.Stats] reads the consumers' NumPending and NumAckPending and the
// dead-letter stream's size. JetStream counts a message waiting out a
// Retry delay in NumAckPending, so Stats reports it in flight, not delayed.
// [Broker.ListDeadLetters], [Broker.GetDeadLetter] (the last message on the
// id's subject), [Broker.RedriveDeadLetters] (a new copy on the queue, the
// dead letter deleted; the target is always the queue whose dead-letter
// stream it is, never a header) and [Broker.PurgeDeadLetters] work on the
// dead-letter stream through JetStream's message-get API, and so do the
// berth command's page walks ([Broker.DeadLetterPage], whose cursor is a
// stream sequence, and [Broker.DeadLetterPageTo], which stops a redrive at
// the stream's last sequence when it began) and deletes by id
// ([Broker.DeleteDeadLetters]).
// A message on a dead-letter subject that berth cannot read (a
// Berth-Message header that does not decode, published there by hand or by
// another producer), or that is not on the subject of its own ID (where
// berth stores a dead letter and looks it up), is listed as a foreign one,
// with the ID
// "<dead-letter stream>:<sequence>:<stored>" (stored: when the stream
// stored it, Unix nanoseconds, so that a stream deleted and created again,
// whose sequences start from 1 again, reuses no ID), its raw headers and
// body, and a
// berth-dlq-reason saying it is not a berth dead letter: the listing shows
// the others, and the letter can be got, deleted or redriven by that ID.
// Stream names hold no ':' (queue names and Prefix cannot), so the form
// parses one way; but any UTF-8 string is a message ID, and a berth letter
// may carry the same one (a foreign letter redriven and dead-lettered
// again does): an action by such an ID takes every letter listed with it,
// the foreign one included, as it takes every letter of a message
// dead-lettered twice, and GetDeadLetter returns the latest of them.
// [Broker.Queues] lists the queues from the stream names.
//
// # Connection loss
//
// nats.go reconnects and resubscribes. Publish and PublishAsync made while
// the connection is down are refused at once with an error wrapping
// [sdk.ErrUnavailable]; a publish that finds it down only as it is written
// (the copies Release and DeadLetter store among them) goes to nats.go's
// reconnect buffer, sent on reconnect, or, beyond that buffer
// (nats.ReconnectBufSize, 8 MiB by default), is refused with an error
// wrapping [sdk.ErrUnavailable] as well. A pull request lost with the
// connection is given up after WaitTime plus a second, and the caller pulls
// again; the next call on the queue first looks its stream and consumers
// up (for at most 2 s) and declares the queue again if one is missing,
// since a pull on a consumer that does not exist (deleted while no pull
// waited on it) is never answered either (with [Options.NoDeclare], a
// missing stream is an error wrapping [sdk.ErrNotFound]); a lookup that
// gets no answer either (a replicated stream or consumer electing a leader
// after its node died) is an error wrapping [sdk.ErrUnavailable], and the
// caller tries again. Settlements and pulls made while it is down are refused at once
// with an error wrapping [sdk.ErrUnavailable]: the message comes back after
// its AckWait. A publish whose ack was lost with the connection fails after
// 5 s, wrapping [sdk.ErrUnavailable]; retrying it stores nothing twice. Once
// the connection is closed for good, calls fail with an error wrapping
// [sdk.ErrUnavailable] (or [sdk.ErrClosed] after Close).
//
// [Connect]'s ctx bounds only the first connect; each reconnect's dial and
// handshake is bounded by the connection's Timeout (nats.go's 2 s, or
// nats.Timeout in [ConnectOptions.Extra]), during which nats.go holds the
// connection's lock. Publish, PublishAsync, Receive and the settlements do
// not wait for that lock to learn the connection is down (they read the
// status the Broker keeps from nats.go's status events, as
// [Broker.ConnectionError] does): made while a reconnect hangs on a silent
// server, they are refused at once.
package jetstream
