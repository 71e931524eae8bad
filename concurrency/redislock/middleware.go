package redislock

import (
	"context"

	"github.com/berthq/berth/sdk"
)

type lockKey struct{}

// FromContext returns the lock [Client.Middleware] holds for the handler
// running under ctx, to read its fencing token.
func FromContext(ctx context.Context) (*Lock, bool) {
	l, ok := ctx.Value(lockKey{}).(*Lock)
	return l, ok
}

// Middleware returns an sdk.Middleware that runs each handler under the lock
// of the resource key(message) names (e.g. "order:" + the order id), with the
// watchdog of [Client.Run]; the handler finds the lock with [FromContext].
//
// A busy resource returns sdk.RetryAfter (a [*BusyError], delay at most
// Options.BusyDelay) without running the handler: the Worker hands the
// delivery back without counting a failed attempt (see sdk.RetryAfter). A
// lock lost while the handler ran gives an error wrapping [ErrLockLost]: a
// transient failure, so the job is retried and its idempotency key decides.
//
// key returns an error for a message that names no resource; the middleware
// returns it as is, so wrap it with sdk.Permanent when no retry can help. The
// lock only saves duplicate work: the handler must still be idempotent.
func (c *Client) Middleware(key func(m *sdk.Message) (string, error)) sdk.Middleware {
	return func(next sdk.Handler) sdk.Handler {
		return sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
			resource, err := key(d.Message())
			if err != nil {
				return err
			}
			return c.Run(ctx, resource, func(ctx context.Context, l *Lock) error {
				return next.Handle(context.WithValue(ctx, lockKey{}, l), d)
			})
		})
	}
}
