package postgres

import (
	"time"

	"github.com/berthq/berth/sdk"
)

var _ sdk.LeaseReporter = (*Broker)(nil)

// Lease returns the lease a claim takes (visibility_until = now + Lease),
// as [sdk.LeaseReporter]: a Worker on this broker takes it as its default.
func (b *Broker) Lease() time.Duration { return b.opts.Lease }

// MaxLease is the longest lease a delivery's ExtendLease gives: [sdk.MaxDelay]
// (12 h, SQS's ceiling too), or [Options.Lease] when that is longer, so that
// an extension by the broker's own lease (the Worker's default) is never
// cut. A longer extension is clamped to it.
func (b *Broker) MaxLease() time.Duration { return max(sdk.MaxDelay, b.opts.Lease) }

var _ sdk.DeliveryCapReporter = (*Broker)(nil)

// MaxDeliveries returns [Options.MaxAttempts], the max_attempts this broker
// writes into the jobs it publishes, as [sdk.DeliveryCapReporter]: a Worker
// whose MaxAttempts is above it is warned about (or refused), and
// dead-letters at it itself so the dead letter keeps the handler's error.
func (b *Broker) MaxDeliveries() int { return b.opts.MaxAttempts }
