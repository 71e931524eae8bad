package sqs

import (
	"time"

	"github.com/berthq/berth/sdk"
)

var _ sdk.LeaseReporter = (*Broker)(nil)

var (
	_ sdk.LongPoller     = (*Broker)(nil)
	_ sdk.ReceiveBatcher = (*Broker)(nil)
)

// ReceiveBatch is the most messages a Receive returns (10, SQS's limit per
// ReceiveMessage); it makes the Broker an [sdk.ReceiveBatcher].
func (b *Broker) ReceiveBatch() int { return batchSize }

// ReceiveWait is how long a Receive long-polls an empty queue
// ([Options.WaitTime]); it makes the Broker an [sdk.LongPoller].
func (b *Broker) ReceiveWait() time.Duration { return b.opts.WaitTime }

// Lease returns the visibility timeout of received messages, as
// [sdk.LeaseReporter]: a Worker on this broker takes it as its default.
func (b *Broker) Lease() time.Duration { return b.opts.VisibilityTimeout }

var _ sdk.DeliveryCapReporter = (*Broker)(nil)

// MaxDeliveries returns [Options.MaxReceiveCount], the maxReceiveCount of the
// redrive policy DeclareQueue sets, as [sdk.DeliveryCapReporter]: a Worker
// whose MaxAttempts is above it is warned about (or refused), and
// dead-letters at it itself so the dead letter keeps the handler's error.
// A queue declared outside berth may have another policy: berth doctor
// checks the queue's own.
func (b *Broker) MaxDeliveries() int { return b.opts.MaxReceiveCount }
