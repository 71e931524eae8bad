package sqs

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/berthq/berth/sdk"
)

// sizeRefresh is how long a queue's MaximumMessageSize, once read, is used
// before it is read again: the attribute can change (SetQueueAttributes,
// Terraform), and a limit raised since is then honoured within this time. A
// limit lowered since makes SQS refuse an entry (InvalidParameterValue), and
// such a refusal makes the next send read it again at once (sendBatch).
const sizeRefresh = time.Minute

// sizeRead is a queue's MaximumMessageSize as last read: n is 0 when it is
// unknown (the read was refused, or the attribute missing).
type sizeRead struct {
	n  int
	at time.Time
}

// queueSize holds a queue's MaximumMessageSize, read at most once per
// [sizeRefresh] whatever the number of callers.
type queueSize struct {
	cur  atomic.Pointer[sizeRead] // nil: not read yet, or to be read again
	read chan struct{}            // one slot: the read under way
}

// set records n, known without reading it (EnsureQueue set it).
func (s *queueSize) set(n int) { s.cur.Store(&sizeRead{n: n, at: time.Now()}) }

// stale makes the next caller read the limit again.
func (s *queueSize) stale() { s.cur.Store(nil) }

// fresh returns the limit read less than sizeRefresh ago, if any.
func (s *queueSize) fresh() (int, bool) {
	if r := s.cur.Load(); r != nil && time.Since(r.at) < sizeRefresh {
		return r.n, true
	}
	return 0, false
}

// maxSize returns q's MaximumMessageSize (0 when unknown), read from SQS at
// most once per [sizeRefresh]; concurrent callers share one read. A read that
// SQS refuses (an IAM policy without sqs:GetQueueAttributes, say) is logged
// and gives 0 until the next refresh: the sizes are then checked against
// [Options.MaxWireSize] only, and SQS refuses what is over the queue's
// limit. A read that fails otherwise (the broker closing, ctx, SQS out of
// reach, the queue gone) is returned: a send would fail the same way.
func (b *Broker) maxSize(ctx context.Context, q *queueRef) (int, error) {
	if n, ok := q.size.fresh(); ok {
		return n, nil
	}
	select {
	case q.size.read <- struct{}{}:
	case <-ctx.Done():
		return 0, b.wrap(ctx, "read the message size limit of "+q.name, ctx.Err())
	case <-b.closing.Done():
		return 0, sdk.ErrClosed
	}
	defer func() { <-q.size.read }()
	if n, ok := q.size.fresh(); ok { // read by the caller before us
		return n, nil
	}
	wctx, done := b.watch(ctx)
	defer done()
	out, err := b.client.GetQueueAttributes(wctx, &awssqs.GetQueueAttributesInput{
		QueueUrl:       aws.String(q.url),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameMaximumMessageSize},
	}, withBody)
	if err != nil {
		err = b.wrap(wctx, "read the message size limit of "+q.name, err)
		if wctx.Err() != nil || errors.Is(err, sdk.ErrClosed) || errors.Is(err, sdk.ErrUnavailable) || errors.Is(err, sdk.ErrNotFound) {
			return 0, err
		}
		b.opts.Logger.Warn("berth/sqs: cannot read the queue's MaximumMessageSize; checking sizes against MaxWireSize only",
			"queue", q.name, "max_wire_size", b.opts.MaxWireSize, "retry_in", sizeRefresh, "err", err)
		q.size.set(0)
		return 0, nil
	}
	n, err := strconv.Atoi(out.Attributes[string(sqstypes.QueueAttributeNameMaximumMessageSize)])
	if err != nil || n <= 0 {
		n = 0
	}
	q.size.set(n)
	return n, nil
}

// wireLimit is the largest encoded message that fits q: [Options.MaxWireSize],
// or q's own MaximumMessageSize when that is smaller (0 from maxSize:
// unknown).
func (b *Broker) wireLimit(ctx context.Context, q *queueRef) (int, error) {
	n, err := b.maxSize(ctx, q)
	if err != nil {
		return 0, err
	}
	if n > 0 && n < b.opts.MaxWireSize {
		return n, nil
	}
	return b.opts.MaxWireSize, nil
}

// sizeRefused reports whether err, of a send or of one of its entries, may
// be SQS refusing a message over the queue's MaximumMessageSize: the code
// SQS gives it (InvalidParameterValue, "Message must be shorter than …").
func sizeRefused(err error) bool {
	var ee *EntryError
	if errors.As(err, &ee) {
		return ee.Code == "InvalidParameterValue"
	}
	return apiCode(err) == "InvalidParameterValue"
}
