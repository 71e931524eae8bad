// Package sqs is the berth broker for Amazon SQS (and SQS-compatible servers
// such as fauxqs or LocalStack), built on aws-sdk-go-v2's SQS client, which
// speaks the AWS JSON protocol.
//
// A [Broker] wraps the application's own *sqs.Client:
//
//	client := awssqs.NewFromConfig(cfg)
//	b, err := sqs.New(client, sqs.Options{VisibilityTimeout: time.Minute})
//	if err != nil { ... }
//	defer b.Close()
//	if err := b.DeclareQueue(ctx, "billing"); err != nil { ... } // queue + "billing-dlq" + redrive policy
//	err = b.Publish(ctx, "billing", &sdk.Message{Type: "billing.charge", Body: body})
//	w, err := sdk.NewWorker(b, handler, sdk.WorkerOptions{Queue: "billing", Lease: time.Minute})
//
// How the berth contract maps onto SQS:
//
//   - Receive long-polls (WaitTimeSeconds, default 20 s) for up to 10 messages,
//     leasing them for [Options.VisibilityTimeout]. Attempt() is the message's
//     ApproximateReceiveCount.
//   - Ack deletes through DeleteMessageBatch: deletes are buffered and sent
//     when 10 are pending for a queue or [Options.AckInterval] after the first
//     one, by goroutines the Broker owns (up to 4 calls in flight). [Broker.Flush] (which the Worker
//     calls when it drains) and Close send what is pending; a delete that SQS
//     refuses is logged and returned by the next Flush ([AckError]). A delete
//     sent when its lease has run out (or is about to) is checked first with
//     ChangeMessageVisibilityBatch: SQS answers success to a stale receipt
//     and deletes nothing, so a stale one is reported lost instead; a
//     delete the SDK retried once the lease had run out (or was about to)
//     is reported with its outcome unknown ([sdk.ErrUnavailable]).
//   - Retry(d) is ChangeMessageVisibility(d, rounded up to whole seconds, so
//     never early); ExtendLease is ChangeMessageVisibility too. SQS caps a
//     message's visibility at 12 hours from its receipt: longer leases fail
//     with a [*LeaseCeilingError], while a longer retry delay is clamped to
//     what the ceiling allows (whole seconds, at least 0), which is how SQS
//     applies [sdk.MaxDelay]: Retry(sdk.MaxDelay) always ends past the
//     ceiling, so its message comes back early by the time since its receipt. SQS cannot hand a message back without
//     counting a receive, so deliveries do not implement [sdk.Releaser].
//   - DeadLetter sends a copy carrying the reason headers to the dead-letter
//     queue, then deletes the original. A copy over [Options.MaxWireSize]
//     (or the dead-letter queue's MaximumMessageSize, when smaller) has its
//     annotations shortened, never the message: the reason cut,
//     else every annotation left out, and [HeaderDeadLetterTruncated] says
//     so. Publish keeps room for the shortest such copy and for a redrive
//     (83 bytes below MaxWireSize), so that every message it accepts can be
//     dead-lettered; only another producer's message too close to the limit
//     cannot (DeadLetter returns an [*sdk.MessageTooLargeError] and the
//     message stays in the queue). A DeadLetter whose lease runs out before
//     the original is deleted takes its copy back out of the dead-letter
//     queue and returns [sdk.ErrLeaseLost]. A message received more than
//     MaxReceiveCount times without being settled is moved to the dead-letter
//     queue by SQS's own redrive policy; berth reports it with the reason
//     [sdk.ErrMaxDeliveries] when it lists it.
//   - Publish uses SendMessageBatch in chunks of at most 10 messages; entries
//     that SQS refuses are reported in an [*sdk.PublishError]. On a FIFO
//     queue the later chunks of the Publish then carry no more messages of
//     a refused entry's group ([ErrGroupHalted]), so none is stored ahead
//     of it. Delays are
//     limited to 15 minutes ([*DelayError]); FIFO queues take no per-message
//     delay at all.
//   - FIFO queues (names ending in ".fifo"): MessageGroupId is Message.Key
//     (or [Options.DefaultGroup]) at Publish; a dead letter and a redrive
//     keep the group the message was received with, whatever the
//     DefaultGroup of the Broker that sends them; MessageDeduplicationId is the
//     IdempotencyKey, else the message ID, hashed when it does not fit SQS's
//     128-character alphabet.
//
// Encoding: SQS allows 10 message attributes and only some characters in a
// body. berth packs every Message field and all headers into one String
// attribute named "berth" (JSON), so any number of headers fits, and sends the
// body as it is when it is SQS text, else base64 (empty bodies are encoded
// too: SQS refuses them). Size is checked before anything is sent, twice: the
// berth size ([sdk.Message.Size]) against [Options.MaxMessageSize] (default
// 256 KiB) and the encoded size against [Options.MaxWireSize] (default 1 MiB,
// SQS's maximum), or the queue's own MaximumMessageSize when that is smaller
// (read once per queue, again every minute and after SQS refused an entry
// as invalid), less 83 bytes kept for the annotations of its dead letter
// (see DeadLetter above); either refusal is an [*sdk.MessageTooLargeError]
// and nothing of the batch is sent.
// Messages without the "berth" attribute (sent by other
// producers) are delivered with their SQS MessageId as ID, their
// MessageGroupId (FIFO) as Key, their body as it is, and their String
// attributes as headers, except those with a reserved
// name (berth-…), which are dropped: only berth writes them.
//
// A Receive cancelled in the middle of its long poll (ctx done, or Close)
// may still have taken messages on the server side: SQS, and fauxqs, answer
// the abandoned poll, and those messages stay invisible for one visibility
// timeout, with one more receive counted. Nothing is lost, but each such
// poll adds an attempt; keep MaxReceiveCount above the Worker's
// MaxAttempts. What the Broker hands back itself is kept from its own
// abandoned polls: while one may still wait on the server, a Retry's
// message stays hidden until that wait is over (at most [Options.WaitTime]
// plus a second), rather than being the first thing the poll takes. The
// Worker's drain adds no attempt: the Broker is an
// [sdk.LongPoller], so a draining Worker gives its polls in flight
// [sdk.LongPollGrace] (2 s) to return what the server already handed them
// instead of cancelling them at once, and deliveries it received but had
// not started are run within the drain deadline rather than retried, since
// a Retry here counts a receive. An idle Worker's poll is cut off after the
// grace (or DrainTimeout, when shorter): its drain lasts at most that much
// longer, and what its interrupted handlers hand back after that comes
// back once the cut poll's wait is over.
//
// Inspection ([Broker.Stats]) reads the approximate counters of
// GetQueueAttributes; SQS has no oldest-message age there (only CloudWatch
// has), so OldestAge is always 0, and messages made invisible by Retry are
// counted as in flight. Dead letters are listed by receiving from the
// dead-letter queue and making the messages visible again, and redriven by
// sending each to the queue whose dead-letter queue it is (never to a queue a
// header names) as a new message (so its receive count, hence Attempt(),
// starts again at 1) and deleting it from the dead-letter queue; this works
// on every SQS-compatible server. These scans page through the dead-letter
// queue until a long-poll receive finds nothing (the approximate counters
// lag, so they never end a scan), extend the visibility of what they hold
// while they run, and redrive and purge page by page. A scan's receive hides
// what it takes for 5 s before the scan extends that hold, so letters taken
// by a receive whose answer was lost (the SDK retried it) are hidden only
// that long, and a scan that retried such a receive does not end before
// then. A Worker's receive cannot do that without an extra call per batch:
// what a lost answer took comes back after the visibility timeout, one
// attempt further on, and Receive logs a warning naming the queue. On a
// FIFO queue every receive carries a ReceiveRequestAttemptId, the same on
// the SDK's retries, so that SQS answers the retry with what the lost
// attempt took (the emulator ignores it; the warning stays). Every call the
// Broker makes carries [SafeRequestBody], which closes the most common way an
// answer was lost on a fast server: a race between net/http and smithy-go
// that closed the connection under a 200 answer (one 5000-message round in
// four or so on the emulator, a 10 s stall each). Get and redrive by IDs
// hold what they pass over, at most 10,000 dead letters; a scan that reaches
// that bound, or a redrive of all that sees dead letters come back while it
// runs, returns a [*ScanError] saying how many remain. A receive cannot see
// a dead letter another reader holds (another scan, a listing elsewhere):
// a scan that must see every letter (a redrive or purge of all, a Get,
// redrive or delete whose IDs it has not found yet) reads the dead-letter
// queue's approximate counters when receives find nothing, scans on while
// they show letters it does not hold, for up to a hold (30 s) after the
// last letter it found, and then
// returns a [*ScanError] counting those it could not see, and saying how
// long it waited, rather than success or [sdk.ErrNotFound]. On a FIFO
// dead-letter queue the letters a scan holds lock their message groups (SQS
// returns no more of a group while earlier letters are held): a Get, or a
// redrive or delete by IDs, of a letter behind the first ones of its group
// (at most 10 come in one receive) cannot reach it, and when nothing but the scan holds letters it ends at
// once with a [*ScanError] that says so (a redrive or purge of all deletes
// as it goes, and reaches every letter). The counters are approximate: on SQS they
// may still count, for a while, letters deleted a moment ago (by this scan
// too), which the scan then waits for, and reports, in vain. A dead letter that
// SQS's redrive policy moved, or that another producer sent, is listed with
// the reason [sdk.ErrMaxDeliveries] and the queue being read as its source,
// whatever berth- headers it carries. SQS does not say when it moved a
// letter: its failure times are taken from the times SQS keeps with it
// (its first receive, ApproximateFirstReceiveTimestamp, or its
// SentTimestamp when later), the same at every listing, so that an age
// filter (`berth dlq -older-than`) matches it.
// [Broker.RedriveDeadLettersProgress] and [Broker.PurgeDeadLettersProgress]
// are the redrive and purge of all that report their running count after
// each page (berth dlq redrive and purge draw it), and
// [Broker.StreamDeadLetters] is a listing that hands its letters over a
// receive at a time instead of holding them all (berth dlq list and a dry
// run keep only what they show); its scan still holds every letter it read
// invisible until it ends.
package sqs
