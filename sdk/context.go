package sdk

import "context"

type correlationKey struct{}

// WithCorrelationID returns a context carrying id. Messages published with that
// context, and by handlers running under it, get id as their CorrelationID.
func WithCorrelationID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, correlationKey{}, id)
}

// withCorrelationRef is WithCorrelationID for the Worker: a pointer to the
// message's field fits an interface without an allocation per message,
// where a string is boxed.
func withCorrelationRef(ctx context.Context, id *string) context.Context {
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
