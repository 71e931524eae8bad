package sdk

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Match them with errors.Is.
var (
	// ErrClosed is returned by every call on a broker after Close.
	ErrClosed = errors.New("berth: broker closed")
	// ErrInvalidQueue reports a queue name a broker cannot use.
	ErrInvalidQueue = errors.New("berth: invalid queue name")
	// ErrInvalidHeader reports a header name or value a broker cannot carry.
	ErrInvalidHeader = errors.New("berth: invalid header")
	// ErrInvalidMessage reports a message that cannot be published as it is.
	ErrInvalidMessage = errors.New("berth: invalid message")
	// ErrMessageTooLarge reports a message over the broker's size limit.
	ErrMessageTooLarge = errors.New("berth: message too large")
	// ErrLeaseLost reports that a delivery's lease expired or was taken by
	// another consumer: settling it changes nothing.
	ErrLeaseLost = errors.New("berth: lease lost")
	// ErrAlreadySettled is returned when a delivery is settled a second time.
	ErrAlreadySettled = errors.New("berth: delivery already settled")
	// ErrUnknownJobType is wrapped by [Router] for a Message.Type with no
	// handler: permanently by default ([DeadLetterUnknown]), in a RetryAfter
	// with [RetryUnknown].
	ErrUnknownJobType = errors.New("berth: unknown job type")
	// ErrUndecodable is wrapped (permanently) by [Decode] for a body that does
	// not decode.
	ErrUndecodable = errors.New("berth: undecodable message body")
	// ErrNotFound reports a dead letter or queue that does not exist.
	ErrNotFound = errors.New("berth: not found")
	// ErrShutdown is the cancellation cause of a handler's context when the
	// Worker stops before the handler finished.
	ErrShutdown = errors.New("berth: worker shutting down")
	// ErrJobTimeout is the cancellation cause of a handler's context when the
	// handler ran longer than its timeout ([WorkerOptions.Timeout]), and is
	// wrapped by the cause the Worker settles such a delivery with. It wraps
	// context.DeadlineExceeded and is transient: the job is retried.
	ErrJobTimeout = fmt.Errorf("berth: job timeout: %w", context.DeadlineExceeded)
	// ErrDrainTimeout is returned by [Worker.Run] when handlers did not return
	// within the drain deadline after their context was cancelled.
	ErrDrainTimeout = errors.New("berth: drain deadline exceeded")
	// ErrGoexit is the Value of the [*PanicError] a handler that called
	// runtime.Goexit (directly or in a library it uses) fails with: the
	// Worker settles its delivery as a panic, a transient failure, and
	// replaces the handler goroutine that Goexit ended.
	ErrGoexit = errors.New("berth: handler called runtime.Goexit")
	// ErrMaxDeliveries is the cause recorded on a message that a broker
	// dead-lettered because it was delivered too many times without being
	// settled (a poison message that kills its workers).
	ErrMaxDeliveries = errors.New("berth: max deliveries exceeded")
	// ErrInvalidOptions is wrapped by the error [NewWorker] (and
	// [CheckConfig]) returns for options that cannot work: a nil subscriber
	// or handler, a negative count or duration where zero means the default
	// (Concurrency, Prefetch, ReceiveLoops, QueueIdleWait, Lease,
	// DrainTimeout, SettleTimeout, a RetryPolicy's MaxAttempts, Backoff.Base
	// or Backoff.Max), a QueueIdleWait below [MinQueueIdleWait], a
	// Concurrency + Prefetch above math.MaxInt32, a
	// HeartbeatInterval longer than half the Lease, queue
	// weights adding up to more than [MaxQueueWeights] (that error wraps
	// [ErrInvalidQueue] too). Bad queue names wrap [ErrInvalidQueue] instead.
	ErrInvalidOptions = errors.New("berth: worker: invalid options")
	// ErrUnavailable reports that the broker cannot be reached right now; the
	// call may be retried. Brokers wrap it with the underlying cause.
	ErrUnavailable = errors.New("berth: broker unavailable")
)

// QueueNameError reports an invalid queue name. It wraps [ErrInvalidQueue].
type QueueNameError struct {
	Name   string
	Reason string // optional detail
}

// Error names the queue and why it is refused.
func (e *QueueNameError) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("berth: invalid queue name %q: %s", e.Name, e.Reason)
	}
	return fmt.Sprintf("berth: invalid queue name %q", e.Name)
}

// Unwrap returns [ErrInvalidQueue].
func (e *QueueNameError) Unwrap() error { return ErrInvalidQueue }

// HeaderError reports a header a broker cannot carry. It wraps [ErrInvalidHeader].
type HeaderError struct {
	Name   string
	Reason string
}

// Error names the header and why it is refused.
func (e *HeaderError) Error() string {
	return fmt.Sprintf("berth: invalid header %q: %s", e.Name, e.Reason)
}

// Unwrap returns [ErrInvalidHeader].
func (e *HeaderError) Unwrap() error { return ErrInvalidHeader }

// MessageTooLargeError reports a message over a broker's limit, found before
// anything was published. It wraps [ErrMessageTooLarge].
type MessageTooLargeError struct {
	ID    string
	Size  int
	Limit int
}

// Error gives the message, its size and the limit.
func (e *MessageTooLargeError) Error() string {
	return fmt.Sprintf("berth: message %s is %d bytes, over the broker limit of %d", e.ID, e.Size, e.Limit)
}

// Unwrap returns [ErrMessageTooLarge].
func (e *MessageTooLargeError) Unwrap() error { return ErrMessageTooLarge }

// PermanentError marks a failure that no retry can fix. The Worker dead-letters
// the delivery at once.
type PermanentError struct{ Err error }

// Error prefixes the cause with "permanent: ".
func (e *PermanentError) Error() string {
	if e.Err == nil {
		return "permanent failure"
	}
	return "permanent: " + e.Err.Error()
}

// Unwrap returns the wrapped error.
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as permanent: the job is dead-lettered, never retried.
// Use it for invalid payloads, missing rows, broken business rules and
// idempotency conflicts. Permanent(nil) returns nil.
//
// Return it: a handler that panics with it (panic(Permanent(err))) has
// panicked, which is a bug, and the Worker treats the panic as any other
// ([ClassPanic], retried with backoff until MaxAttempts), not as a verdict.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// RetryAfterError asks for the job to be tried again after Delay.
type RetryAfterError struct {
	Err   error
	Delay time.Duration
}

// Error gives the delay and the cause.
func (e *RetryAfterError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("retry after %s", e.Delay)
	}
	return fmt.Sprintf("retry after %s: %v", e.Delay, e.Err)
}

// Unwrap returns the wrapped error.
func (e *RetryAfterError) Unwrap() error { return e.Err }

// RetryAfter asks for the job to run again after d, for a resource that is busy
// or rate limited rather than broken. It does not count as a failed attempt:
// the Worker never dead-letters because of it, and releases the delivery
// without consuming an attempt where the broker can ([Releaser]: memory,
// RabbitMQ, PostgreSQL). Where it cannot (SQS), the delivery is retried and
// the receive counts toward the broker's own redrive cap (maxReceiveCount),
// which does dead-letter a job that is busy forever: at the cap's last
// receive ([DeliveryCapReporter]) the Worker dead-letters it itself, so the
// dead letter carries err. err may be nil.
//
// A handler that returns RetryAfter for ever on a releasing broker runs for
// ever: bound such loops in the handler (a deadline in the payload, a
// counter in a store) when "busy" may not end.
func RetryAfter(err error, d time.Duration) error {
	if d < 0 {
		d = 0
	}
	return &RetryAfterError{Err: err, Delay: d}
}

// PanicError is the error a recovered handler panic becomes. It is
// transient ([ClassPanic]) whatever the panic value, even a Permanent or
// RetryAfter error (see [Classify]).
type PanicError struct {
	Value any
	Stack []byte
}

// Error gives the panic value.
//
// The value is untrusted: it is printed as valid UTF-8 of at most
// [MaxReasonLength] bytes, and named by its type when printing it panics
// (a String or Error method that panics with a value whose own method
// panics would otherwise panic out of every caller of Error).
func (e *PanicError) Error() string { return "handler panic: " + panicText(e.Value) }

// Unwrap returns the panic value when it is an error (panic(err)), so that
// errors.Is sees through a panic to its cause.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// ErrorClass names how the Worker treats an error. It labels logs, metrics and
// dead-letter headers.
type ErrorClass string

// The error classes.
const (
	ClassNone       ErrorClass = ""
	ClassPermanent  ErrorClass = "permanent"
	ClassRetryAfter ErrorClass = "retry_after"
	ClassTransient  ErrorClass = "transient"
	ClassPanic      ErrorClass = "panic"
	ClassCanceled   ErrorClass = "canceled"
	ClassPoison     ErrorClass = "max_deliveries"
	ClassUnknown    ErrorClass = "unknown" // a dead letter without a cause
)

// Classify returns the class of err: nil is ClassNone; Permanent,
// RetryAfter, panics and ErrMaxDeliveries have their own class; context
// cancellation is ClassCanceled; everything else is transient.
//
// A recovered panic ([*PanicError]) is ClassPanic whatever its value: a
// panic is a bug, and panic(Permanent(err)) or panic(RetryAfter(err, d))
// is no verdict of the handler's (the Worker retries it with backoff and
// dead-letters it at MaxAttempts, as any panic). Only a Permanent or
// RetryAfter wrapped around the PanicError, outside its value, counts.
func Classify(err error) ErrorClass {
	if err == nil {
		return ClassNone
	}
	var pa *PanicError
	if errors.As(err, &pa) {
		return classifyPanic(err, pa)
	}
	var pe *PermanentError
	if errors.As(err, &pe) {
		return ClassPermanent
	}
	var re *RetryAfterError
	if errors.As(err, &re) {
		return ClassRetryAfter
	}
	if errors.Is(err, ErrMaxDeliveries) {
		return ClassPoison
	}
	if errors.Is(err, context.Canceled) {
		return ClassCanceled
	}
	return ClassTransient
}

// classifyPanic classifies err, whose chain holds the panic pa: ClassPanic,
// unless a Permanent or RetryAfter marks err outside pa's value (errors.As
// finds the outermost; the one it finds in pa is then another).
func classifyPanic(err error, pa *PanicError) ErrorClass {
	var pe, inPe *PermanentError
	if errors.As(err, &pe) && (!errors.As(pa.Unwrap(), &inPe) || inPe != pe) {
		return ClassPermanent
	}
	var re, inRe *RetryAfterError
	if errors.As(err, &re) && (!errors.As(pa.Unwrap(), &inRe) || inRe != re) {
		return ClassRetryAfter
	}
	return ClassPanic
}

// IsPermanent reports whether err is marked [Permanent].
func IsPermanent(err error) bool { return Classify(err) == ClassPermanent }
