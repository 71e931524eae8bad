package sdk

import "context"

// Handler processes one delivery. It returns nil when the job's effect is done
// and durable, or an error that tells the Worker how to settle (see the package
// doc). Handlers never settle deliveries themselves.
//
// A panic is recovered by the Worker and becomes a [*PanicError]: a transient
// failure ([ClassPanic]), retried with backoff and dead-lettered at
// MaxAttempts, whatever the panic value — panic(Permanent(err)) is not
// dead-lettered at once, nor panic(RetryAfter(err, d)) released: only the
// returned error is the handler's verdict. A handler that calls
// runtime.Goexit fails the same way, with a *PanicError whose Value is
// [ErrGoexit], and the Worker replaces the goroutine it ended.
type Handler interface {
	Handle(ctx context.Context, d Delivery) error
}

// HandlerFunc adapts a function to [Handler].
type HandlerFunc func(ctx context.Context, d Delivery) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, d Delivery) error { return f(ctx, d) }

// Middleware wraps a Handler: idempotency, locks, telemetry are middleware.
type Middleware func(Handler) Handler

// Chain wraps h in mws, the first outermost: Chain(h, a, b) runs a, then b, then h.
func Chain(h Handler, mws ...Middleware) Handler {
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}
