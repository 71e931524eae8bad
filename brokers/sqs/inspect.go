package sqs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/berthq/berth/sdk"
)

// Dead-letter scans hold the messages they receive this long, then make
// them visible again.
const (
	holdFor = 30 * time.Second
	// maxScan bounds how many dead letters one Get, Redrive or Purge call
	// looks at.
	maxScan = 10000
	// defaultListLimit is ListDeadLetters' limit when none is given.
	defaultListLimit = 100
)

// Stats reports queue's approximate counters (GetQueueAttributes):
// ApproximateNumberOfMessages (Ready), ...Delayed (Delayed),
// ...NotVisible (InFlight: received and not settled, and also messages
// waiting out a Retry delay), and the dead-letter queue's total
// (DeadLettered). SQS reports no oldest-message age there: OldestAge is 0.
// It implements [sdk.Inspector].
func (b *Broker) Stats(ctx context.Context, queue string) (sdk.QueueStats, error) {
	st := sdk.QueueStats{Queue: queue}
	if b.closed.Load() {
		return st, sdk.ErrClosed
	}
	ctx, done := b.watch(ctx)
	defer done()
	q, err := b.queue(ctx, queue)
	if err != nil {
		return st, err
	}
	c, err := b.counts(ctx, q)
	if err != nil {
		return st, err
	}
	st.Ready, st.InFlight, st.Delayed = c[0], c[1], c[2]
	dlq, err := b.deadLetterQueue(ctx, q)
	if errors.Is(err, sdk.ErrNotFound) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	if c, err = b.counts(ctx, dlq); err != nil {
		return st, err
	}
	st.DeadLettered = c[0] + c[1] + c[2]
	return st, nil
}

// counts returns q's visible, not visible and delayed message counts.
func (b *Broker) counts(ctx context.Context, q *queueRef) ([3]int64, error) {
	var c [3]int64
	names := []sqstypes.QueueAttributeName{
		sqstypes.QueueAttributeNameApproximateNumberOfMessages,
		sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
		sqstypes.QueueAttributeNameApproximateNumberOfMessagesDelayed,
	}
	out, err := b.client.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(q.url), AttributeNames: names})
	if err != nil {
		return c, b.wrap(ctx, "read counters of "+q.name, err)
	}
	for i, n := range names {
		c[i], _ = strconv.ParseInt(out.Attributes[string(n)], 10, 64)
	}
	return c, nil
}

// heldLetter is a dead letter received (and so invisible) during a scan.
type heldLetter struct {
	raw sqstypes.Message
	msg *sdk.Message
}

// scan receives up to limit messages from q's dead-letter queue, holding
// them invisible, until stop returns true for one of them or the queue looks
// empty. The caller releases or deletes what it holds.
func (b *Broker) scan(ctx context.Context, q *queueRef, limit int, stop func(*sdk.Message) bool) (*queueRef, []heldLetter, error) {
	dlq, err := b.deadLetterQueue(ctx, q)
	if err != nil {
		return nil, nil, err
	}
	var held []heldLetter
	seen := map[string]bool{}
	for len(held) < limit {
		// The visible count first: a receive on an empty queue would wait.
		c, err := b.counts(ctx, dlq)
		if err != nil {
			return dlq, held, err
		}
		if c[0] == 0 {
			break
		}
		msgs, _, err := b.receive(ctx, dlq, min(batchSize, limit-len(held)), holdFor, time.Second)
		if err != nil {
			return dlq, held, err
		}
		if len(msgs) == 0 {
			break
		}
		found := false
		for _, m := range msgs {
			id := aws.ToString(m.MessageId)
			if seen[id] {
				continue
			}
			seen[id] = true
			msg := b.message(dlq, m)
			b.annotate(q, msg, m)
			held = append(held, heldLetter{raw: m, msg: msg})
			if stop != nil && stop(msg) {
				found = true
			}
		}
		if found {
			break
		}
	}
	return dlq, held, nil
}

// annotate gives a message that SQS's redrive policy moved (it has no reason
// headers) the headers of a poison message: reason [sdk.ErrMaxDeliveries],
// attempts the policy's maxReceiveCount, failure time now (SQS does not
// say when it moved it).
func (b *Broker) annotate(q *queueRef, msg *sdk.Message, raw sqstypes.Message) {
	if msg.Header(sdk.HeaderDeadLetterReason) != "" {
		return
	}
	attempts := q.maxReceive
	if attempts <= 0 {
		attempts = max(receiveCount(raw)-1, 1)
	}
	sdk.AnnotateDeadLetter(msg, q.name, attempts, sdk.ErrMaxDeliveries, time.Time{}, time.Now())
}

// release makes held messages visible again.
func (b *Broker) release(ctx context.Context, dlq *queueRef, held []heldLetter) error {
	var errs []error
	for start := 0; start < len(held); start += batchSize {
		chunk := held[start:min(start+batchSize, len(held))]
		in := &awssqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(dlq.url)}
		for i, h := range chunk {
			in.Entries = append(in.Entries, sqstypes.ChangeMessageVisibilityBatchRequestEntry{
				Id: aws.String(strconv.Itoa(i)), ReceiptHandle: h.raw.ReceiptHandle, VisibilityTimeout: 0,
			})
		}
		out, err := b.client.ChangeMessageVisibilityBatch(ctx, in)
		if err != nil {
			errs = append(errs, b.wrap(ctx, "release dead letters of "+dlq.name, err))
			continue
		}
		for _, f := range out.Failed {
			errs = append(errs, fmt.Errorf("berth/sqs: release a dead letter of %s: %w", dlq.name,
				&EntryError{Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}))
		}
	}
	return errors.Join(errs...)
}

// remove deletes held messages now.
func (b *Broker) remove(ctx context.Context, dlq *queueRef, held []heldLetter) (int, error) {
	var errs []error
	n := 0
	for start := 0; start < len(held); start += batchSize {
		chunk := held[start:min(start+batchSize, len(held))]
		in := &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(dlq.url)}
		for i, h := range chunk {
			in.Entries = append(in.Entries, sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: h.raw.ReceiptHandle})
		}
		out, err := b.client.DeleteMessageBatch(ctx, in)
		if err != nil {
			errs = append(errs, b.wrap(ctx, "delete dead letters of "+dlq.name, err))
			continue
		}
		n += len(out.Successful)
		for _, f := range out.Failed {
			errs = append(errs, fmt.Errorf("berth/sqs: delete a dead letter of %s: %w", dlq.name,
				&EntryError{Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}))
		}
	}
	return n, errors.Join(errs...)
}

// ListDeadLetters returns up to limit (default 100) messages of queue's
// dead-letter queue, with their reason headers. It receives them, holding
// them invisible while it scans, then makes them visible again: concurrent
// scans of the same queue see fewer messages. It implements
// [sdk.DeadLetters].
func (b *Broker) ListDeadLetters(ctx context.Context, queue string, limit int) ([]*sdk.Message, error) {
	if limit <= 0 {
		limit = defaultListLimit
	}
	var out []*sdk.Message
	err := b.withDeadLetters(ctx, queue, limit, nil, func(ctx context.Context, dlq *queueRef, held []heldLetter) ([]heldLetter, error) {
		for _, h := range held {
			out = append(out, h.msg)
		}
		return nil, nil
	})
	return out, err
}

// GetDeadLetter returns the dead letter with berth ID (or SQS MessageId) id,
// or an error wrapping [sdk.ErrNotFound].
func (b *Broker) GetDeadLetter(ctx context.Context, queue, id string) (*sdk.Message, error) {
	var found *sdk.Message
	match := func(m *sdk.Message) bool { return m.ID == id }
	err := b.withDeadLetters(ctx, queue, maxScan, match, func(ctx context.Context, dlq *queueRef, held []heldLetter) ([]heldLetter, error) {
		for _, h := range held {
			if h.msg.ID == id || aws.ToString(h.raw.MessageId) == id {
				found = h.msg
			}
		}
		return nil, nil
	})
	if err != nil {
		return nil, err
	}
	if found == nil {
		return nil, fmt.Errorf("berth/sqs: dead letter %s of %s: %w", id, queue, sdk.ErrNotFound)
	}
	return found, nil
}

// RedriveDeadLetters sends the dead letters with the given IDs (all of them
// when none is given) back to the queue they came from, as new messages (so
// their receive count, Attempt(), starts again) with the reason headers
// removed and [sdk.HeaderRedriveCount] incremented, and deletes them from the
// dead-letter queue. It returns how many it redrove, and an error wrapping
// [sdk.ErrNotFound] naming the IDs it did not find.
func (b *Broker) RedriveDeadLetters(ctx context.Context, queue string, ids ...string) (int, error) {
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	var stop func(*sdk.Message) bool
	if len(want) > 0 {
		left := len(want)
		stop = func(m *sdk.Message) bool {
			if want[m.ID] {
				left--
			}
			return left == 0
		}
	}
	redriven := 0
	found := map[string]bool{}
	err := b.withDeadLetters(ctx, queue, maxScan, stop, func(ctx context.Context, dlq *queueRef, held []heldLetter) ([]heldLetter, error) {
		byTarget := map[string][]heldLetter{}
		for _, h := range held {
			if len(want) > 0 && !want[h.msg.ID] && !want[aws.ToString(h.raw.MessageId)] {
				continue
			}
			found[h.msg.ID], found[aws.ToString(h.raw.MessageId)] = true, true
			m := h.msg.Clone()
			target := sdk.PrepareRedrive(m, queue)
			byTarget[target] = append(byTarget[target], heldLetter{raw: h.raw, msg: m})
		}
		var done []heldLetter
		var errs []error
		for target, hs := range byTarget {
			tq, err := b.queue(ctx, target)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			// Only the dead letters whose copy was sent may be deleted:
			// one that cannot be encoded for the target stays where it is.
			entries := make([]sendEntry, 0, len(hs))
			sendable := hs[:0:0]
			for _, h := range hs {
				e, err := b.entry(h.msg, tq.fifo, "")
				if err != nil {
					errs = append(errs, err)
					continue
				}
				entries = append(entries, e)
				sendable = append(sendable, h)
			}
			if len(entries) == 0 {
				continue
			}
			err = b.send(ctx, tq, entries)
			var pe *sdk.PublishError
			switch {
			case err == nil:
			case errors.As(err, &pe):
				errs = append(errs, err)
			default:
				errs = append(errs, err)
				continue
			}
			for _, h := range sendable {
				if pe == nil || pe.Failed[h.msg.ID] == nil {
					done = append(done, h)
				}
			}
		}
		n, err := b.remove(ctx, dlq, done)
		redriven += n
		return done, errors.Join(append(errs, err)...)
	})
	if err != nil {
		return redriven, err
	}
	var missing []string
	for _, id := range ids {
		if !found[id] {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		return redriven, fmt.Errorf("berth/sqs: dead letters %s of %s: %w", strings.Join(missing, ", "), queue, sdk.ErrNotFound)
	}
	return redriven, nil
}

// PurgeDeadLetters deletes every message of queue's dead-letter queue and
// returns how many it deleted (counted one by one, not through PurgeQueue,
// which SQS limits to once a minute and applies lazily).
func (b *Broker) PurgeDeadLetters(ctx context.Context, queue string) (int, error) {
	total := 0
	for {
		n := 0
		err := b.withDeadLetters(ctx, queue, 100, nil, func(ctx context.Context, dlq *queueRef, held []heldLetter) ([]heldLetter, error) {
			var err error
			n, err = b.remove(ctx, dlq, held)
			return held, err
		})
		total += n
		if err != nil || n == 0 {
			return total, err
		}
	}
}

// withDeadLetters scans queue's dead letters, lets fn act on those it
// holds, then releases those fn did not consume.
func (b *Broker) withDeadLetters(ctx context.Context, queue string, limit int, stop func(*sdk.Message) bool,
	fn func(ctx context.Context, dlq *queueRef, held []heldLetter) (consumed []heldLetter, err error)) error {
	if b.closed.Load() {
		return sdk.ErrClosed
	}
	ctx, done := b.watch(ctx)
	defer done()
	q, err := b.queue(ctx, queue)
	if err != nil {
		return err
	}
	dlq, held, err := b.scan(ctx, q, limit, stop)
	if dlq == nil {
		return err
	}
	var consumed []heldLetter
	if err == nil {
		consumed, err = fn(ctx, dlq, held)
	}
	gone := map[string]bool{}
	for _, h := range consumed {
		gone[aws.ToString(h.raw.ReceiptHandle)] = true
	}
	var rest []heldLetter
	for _, h := range held {
		if !gone[aws.ToString(h.raw.ReceiptHandle)] {
			rest = append(rest, h)
		}
	}
	// Release even when ctx is done, so that a cancelled scan does not hide
	// the dead letters for holdFor.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return errors.Join(err, b.release(rctx, dlq, rest))
}
