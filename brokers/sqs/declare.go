package sqs

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/berthq/berth/sdk"
)

// QueueConfig is the topology EnsureQueue creates. The zero value takes the
// broker's [Options].
type QueueConfig struct {
	// MaxReceiveCount of the redrive policy. Default [Options.MaxReceiveCount].
	MaxReceiveCount int
	// DeadLetterQueue names the dead-letter queue. Default the queue's name
	// with [Options.DeadLetterSuffix] (before ".fifo").
	DeadLetterQueue string
}

// DeclareQueue creates queue and its dead-letter queue with the broker's
// defaults. It implements [sdk.QueueDeclarer]; see [Broker.EnsureQueue].
func (b *Broker) DeclareQueue(ctx context.Context, queue string) error {
	return b.EnsureQueue(ctx, queue, QueueConfig{})
}

// EnsureQueue creates queue (FIFO when its name ends in ".fifo") and its
// dead-letter queue (FIFO too, then), and sets queue's redrive policy
// (maxReceiveCount), visibility timeout ([Options.VisibilityTimeout]) and
// long-poll wait ([Options.WaitTime], for consumers other than berth too),
// and MaximumMessageSize ([Options.MaxWireSize]) on both. It is idempotent:
// on existing queues it sets those attributes again, and leaves the others
// alone. The URLs are cached.
func (b *Broker) EnsureQueue(ctx context.Context, queue string, cfg QueueConfig) error {
	if b.closed.Load() {
		return sdk.ErrClosed
	}
	if err := validateQueueName(queue); err != nil {
		return err
	}
	if cfg.MaxReceiveCount == 0 {
		cfg.MaxReceiveCount = b.opts.MaxReceiveCount
	}
	if cfg.MaxReceiveCount < 1 || cfg.MaxReceiveCount > 1000 {
		return errors.New("berth/sqs: MaxReceiveCount " + strconv.Itoa(cfg.MaxReceiveCount) + " outside [1, 1000]")
	}
	dlqName := cfg.DeadLetterQueue
	if dlqName == "" {
		dlqName = b.deadLetterName(queue)
	}
	if err := validateQueueName(dlqName); err != nil {
		return err
	}
	if len(dlqName) > maxQueueNameLen {
		return &sdk.QueueNameError{Name: queue, Reason: "its dead-letter queue " + dlqName + " would exceed SQS's 80 characters"}
	}
	if isFIFOName(dlqName) != isFIFOName(queue) {
		return &sdk.QueueNameError{Name: dlqName, Reason: "the dead-letter queue of a FIFO queue must be FIFO, and of a standard queue standard"}
	}
	ctx, done := b.watch(ctx)
	defer done()

	common := map[string]string{
		string(sqstypes.QueueAttributeNameMaximumMessageSize): strconv.Itoa(b.opts.MaxWireSize),
	}
	if isFIFOName(queue) {
		common[string(sqstypes.QueueAttributeNameFifoQueue)] = "true"
	}
	dlqAttrs := clone(common)
	dlqAttrs[string(sqstypes.QueueAttributeNameMessageRetentionPeriod)] = strconv.Itoa(14 * 24 * 3600)
	dlq, err := b.create(ctx, dlqName, dlqAttrs)
	if err != nil {
		return err
	}
	out, err := b.client.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{
		QueueUrl:       aws.String(dlq.url),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn},
	}, withBody)
	if err != nil {
		return b.wrap(ctx, "read the ARN of "+dlqName, err)
	}
	policy, _ := json.Marshal(map[string]string{
		"deadLetterTargetArn": out.Attributes[string(sqstypes.QueueAttributeNameQueueArn)],
		"maxReceiveCount":     strconv.Itoa(cfg.MaxReceiveCount),
	})
	attrs := clone(common)
	attrs[string(sqstypes.QueueAttributeNameRedrivePolicy)] = string(policy)
	attrs[string(sqstypes.QueueAttributeNameVisibilityTimeout)] = strconv.Itoa(int(ceilSeconds(b.opts.VisibilityTimeout)))
	// Long polling for every consumer of the queue, not only berth's
	// receives (which ask for WaitTime themselves): berth doctor's
	// sqs.long-polling.
	attrs[string(sqstypes.QueueAttributeNameReceiveMessageWaitTimeSeconds)] = strconv.Itoa(int(ceilSeconds(b.opts.WaitTime)))
	q, err := b.create(ctx, queue, attrs)
	if err != nil {
		return err
	}
	select {
	case q.dlqLock <- struct{}{}:
	case <-ctx.Done():
		return b.wrap(ctx, "declare queue "+queue, ctx.Err())
	}
	q.dlq = dlq
	q.maxReceive.Store(int64(cfg.MaxReceiveCount))
	<-q.dlqLock
	// Both queues' MaximumMessageSize is now MaxWireSize: no need to read it.
	q.size.set(b.opts.MaxWireSize)
	dlq.size.set(b.opts.MaxWireSize)
	return nil
}

// create creates queue name with attrs, or, when it exists with other
// attributes, sets attrs on it (FifoQueue cannot change and is left out).
func (b *Broker) create(ctx context.Context, name string, attrs map[string]string) (*queueRef, error) {
	out, err := b.client.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs}, withBody)
	if err == nil {
		return b.remember(name, aws.ToString(out.QueueUrl)), nil
	}
	var exists *sqstypes.QueueNameExists
	if !errors.As(err, &exists) && apiCode(err) != "QueueAlreadyExists" {
		return nil, b.wrap(ctx, "create queue "+name, err)
	}
	q, err := b.queue(ctx, name)
	if err != nil {
		return nil, err
	}
	set := clone(attrs)
	delete(set, string(sqstypes.QueueAttributeNameFifoQueue))
	if _, err := b.client.SetQueueAttributes(ctx, &awssqs.SetQueueAttributesInput{QueueUrl: aws.String(q.url), Attributes: set}, withBody); err != nil {
		return nil, b.wrap(ctx, "update queue "+name, err)
	}
	return q, nil
}

// DeleteQueue deletes queue and, when deadLetters is true, its dead-letter
// queue. A queue that does not exist is not an error. Tests and tools use it.
func (b *Broker) DeleteQueue(ctx context.Context, queue string, deadLetters bool) error {
	if b.closed.Load() {
		return sdk.ErrClosed
	}
	ctx, done := b.watch(ctx)
	defer done()
	q, err := b.queue(ctx, queue)
	if errors.Is(err, sdk.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	if deadLetters {
		if dlq, err := b.deadLetterQueue(ctx, q); err == nil {
			if _, err := b.client.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: aws.String(dlq.url)}, withBody); err != nil {
				errs = append(errs, b.wrap(ctx, "delete queue "+dlq.name, err))
			}
			b.forget(dlq.name)
		} else if !errors.Is(err, sdk.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	if _, err := b.client.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: aws.String(q.url)}, withBody); err != nil {
		errs = append(errs, b.wrap(ctx, "delete queue "+queue, err))
	}
	b.forget(queue)
	return errors.Join(errs...)
}

func clone(m map[string]string) map[string]string {
	out := make(map[string]string, len(m)+2)
	for k, v := range m {
		out[k] = v
	}
	return out
}
