package sdk

import (
	"context"
	"time"
)

type correlationKey struct{}

// WithCorrelationID returns a context carrying id. Messages published with that
// context, and by handlers running under it, get id as their CorrelationID.
func WithCorrelationID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, correlationKey{}, id)
}

// CorrelationID returns the correlation ID in ctx, or "".
func CorrelationID(ctx context.Context) string {
	switch id := ctx.Value(correlationKey{}).(type) {
	case string:
		return id
	case *string:
		return *id
	}
	return ""
}

// detachedCtx is [context.WithoutCancel] for the bases of the Worker's
// handler contexts. The standard library's version is a struct value that
// is boxed again, an allocation, by every Value lookup passing through it
// (a tracer looking for the current span, a logger for a trace ID), which
// on a handler context is every lookup that finds nothing. Like it, it
// hides the parent's cancellation, its deadline and its cause.
type detachedCtx struct{ parent context.Context }

func detach(ctx context.Context) context.Context { return &detachedCtx{parent: ctx} }

func (*detachedCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*detachedCtx) Done() <-chan struct{}       { return nil }
func (*detachedCtx) Err() error                  { return nil }

// Value returns the parent's value for key, except the key by which
// [context.Cause] finds the cancellation (see cancelCauseKey).
func (c *detachedCtx) Value(key any) any {
	if key == cancelCauseKey {
		return nil
	}
	return c.parent.Value(key)
}

func (c *detachedCtx) String() string { return "berth.detached" }

// cancelCauseKey is the (unexported) key by which [context.Cause] looks for
// a cancelled parent through Value; a detached context must not find the
// parent's, as context.WithoutCancel does not. It is learnt once by asking
// context.Cause about a context that records the key it is asked.
var cancelCauseKey = func() any {
	p := &keyProbe{}
	_ = context.Cause(p)
	return p.key
}()

type keyProbe struct {
	context.Context // nil: only Value and Err are called
	key             any
}

func (p *keyProbe) Value(key any) any {
	if p.key == nil {
		p.key = key
	}
	return nil
}

func (p *keyProbe) Err() error { return context.Canceled }
