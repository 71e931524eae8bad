package postgres

import (
	"time"

	"github.com/berthq/berth/sdk"
)

var _ sdk.LeaseReporter = (*Broker)(nil)

// Lease returns the lease a claim takes (visibility_until = now + Lease),
// as [sdk.LeaseReporter]: a Worker on this broker takes it as its default.
func (b *Broker) Lease() time.Duration { return b.opts.Lease }
