package sdk

import "context"

type correlationKey struct{}

// WithCorrelationID returns a context carrying id. Messages published with that
// context, and by handlers running under it, get id as their CorrelationID.
func WithCorrelationID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, correlationKey{}, id)
}

// CorrelationID returns the correlation ID in ctx, or "".
func CorrelationID(ctx context.Context) string {
	id, _ := ctx.Value(correlationKey{}).(string)
	return id
}
