package sdk

import (
	"context"
	"fmt"
	"reflect"
)

// JobArgs is the payload of a typed job: a value encoded as the message's
// JSON body, whose Kind names its job type ([Message.Type]). Declaring the
// kind on the payload type ties the two at compile time: [NewJob] takes the
// type from the value, and [HandleJob] registers a handler for the kind of
// the type it decodes, so a producer cannot send a payload under another
// type's name, and a handler cannot be registered for a type whose body it
// does not decode.
//
//	type ChargeOrder struct {
//		OrderID string `json:"order_id"`
//		Cents   int64  `json:"cents"`
//	}
//
//	func (ChargeOrder) Kind() string { return "billing.charge" }
//
// Kind must return a constant: it is called on the zero value (a nil
// pointer for a pointer type) when a handler is registered.
type JobArgs interface {
	Kind() string
}

// JobKeyer is implemented by job args that name their business operation:
// [NewJob] sets [Message.IdempotencyKey] from it, so the key is derived from
// the payload in one place, for every producer.
type JobKeyer interface {
	IdempotencyKey() string
}

// Job is one delivery of a typed job: the decoded args and the delivery they
// came in (its Message, Attempt and Queue). Handlers never settle the
// delivery themselves; they return an error, as any [Handler].
type Job[T JobArgs] struct {
	Args     T
	Delivery Delivery
}

// NewJob returns a message of args' kind whose body is args encoded as JSON,
// with the idempotency key args give when they implement [JobKeyer]. Set
// the other fields (Key, Delay, Headers) on the returned message. Nil args,
// a nil pointer included, and args that encode to null are refused with
// [ErrInvalidMessage].
func NewJob(args JobArgs) (*Message, error) {
	if args == nil {
		return nil, fmt.Errorf("%w: nil job args", ErrInvalidMessage)
	}
	if v := reflect.ValueOf(args); v.Kind() == reflect.Pointer && v.IsNil() {
		// It would encode to null; and Kind, declared on the value type,
		// would panic on it.
		return nil, fmt.Errorf("%w: nil job args %T", ErrInvalidMessage, args)
	}
	kind := args.Kind()
	if kind == "" {
		return nil, fmt.Errorf("%w: job args %T have an empty Kind", ErrInvalidMessage, args)
	}
	m, err := NewJSON(kind, args)
	if err != nil {
		return nil, err
	}
	if k, ok := args.(JobKeyer); ok {
		m.IdempotencyKey = k.IdempotencyKey()
	}
	return m, nil
}

// KindOf returns the job type of T, the Kind of its zero value.
func KindOf[T JobArgs]() string {
	var zero T
	return zero.Kind()
}

// JobHandler returns a Handler that decodes each delivery's body into a T
// (as [Decode]: unknown fields ignored) and calls fn with it. An undecodable
// body is a permanent failure, and so is a delivery whose type is not T's
// kind (a wiring mistake: the handler was mounted for another type); fn is
// not called for either.
func JobHandler[T JobArgs](fn func(ctx context.Context, j Job[T]) error) Handler {
	if fn == nil {
		panic("berth: JobHandler: nil function for job kind " + quoteType(KindOf[T]()))
	}
	kind := KindOf[T]()
	return HandlerFunc(func(ctx context.Context, d Delivery) error {
		m := d.Message()
		if m.Type != kind {
			return Permanent(fmt.Errorf("%w %s: this handler takes %s", ErrUnknownJobType, quoteType(m.Type), quoteType(kind)))
		}
		args, err := Decode[T](m)
		if err != nil {
			return err
		}
		return fn(ctx, Job[T]{Args: args, Delivery: d})
	})
}

// HandleJob registers fn on r for T's kind ([KindOf]). Like
// [Router.Register] it panics when that kind already has a handler, when
// the kind is empty or when fn is nil: each is a wiring bug found at start.
func HandleJob[T JobArgs](r *Router, fn func(ctx context.Context, j Job[T]) error) {
	kind := KindOf[T]()
	if kind == "" {
		var zero T
		panic(fmt.Sprintf("berth: HandleJob: job args %T have an empty Kind", zero))
	}
	r.Register(kind, JobHandler(fn))
}
