package sdk

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Router is a Handler that dispatches by Message.Type.
//
// A type with no handler goes to the unknown-type handler ([Router.HandleUnknown]).
// By default that is [DeadLetterUnknown]: a permanent failure wrapping
// [ErrUnknownJobType], so the job is dead-lettered at once with a reason that
// names the type, never redelivered in a loop. During a rolling deploy in which
// producers ship a new type before every consumer knows it, use
// [RetryUnknown] instead, so that old consumers hand such jobs back until a
// new one takes them (ARCHITECTURE.md, "Settlement").
//
// Handlers may be registered while the router serves; routes are read under a lock.
type Router struct {
	mu      sync.RWMutex
	routes  map[string]Handler
	unknown Handler
}

// NewRouter returns an empty Router that dead-letters unknown types.
func NewRouter() *Router { return &Router{routes: make(map[string]Handler)} }

// Register routes jobType to h. Like [net/http.ServeMux.Handle], it panics
// when jobType already has a handler (two handlers for one type is a wiring
// bug that would otherwise silently drop one of them) or when h is nil.
func (r *Router) Register(jobType string, h Handler) {
	if h == nil {
		panic("berth: Router.Register: nil handler for job type " + quoteType(jobType))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.routes[jobType]; dup {
		panic("berth: Router.Register: job type " + quoteType(jobType) + " registered twice")
	}
	r.routes[jobType] = h
}

// RegisterFunc routes jobType to f. It panics like [Router.Register].
func (r *Router) RegisterFunc(jobType string, f func(ctx context.Context, d Delivery) error) {
	if f == nil {
		panic("berth: Router.RegisterFunc: nil handler for job type " + quoteType(jobType))
	}
	r.Register(jobType, HandlerFunc(f))
}

// HandleUnknown sets the handler for job types with no handler of their own:
// [DeadLetterUnknown] (the default, also what a nil h restores),
// [RetryUnknown], or any Handler of the application's.
func (r *Router) HandleUnknown(h Handler) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unknown = h
}

// Types returns the registered job types, sorted.
func (r *Router) Types() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	ts := make([]string, 0, len(r.routes))
	for t := range r.routes {
		ts = append(ts, t)
	}
	sort.Strings(ts)
	return ts
}

// Handle dispatches d to the handler of its type, or to the unknown-type
// handler.
func (r *Router) Handle(ctx context.Context, d Delivery) error {
	t := d.Message().Type
	r.mu.RLock()
	h, ok := r.routes[t]
	if !ok {
		h = r.unknown
	}
	r.mu.RUnlock()
	if h == nil {
		h = deadLetterUnknown
	}
	return h.Handle(ctx, d)
}

var deadLetterUnknown = DeadLetterUnknown()

// DeadLetterUnknown returns the default unknown-type handler: it fails
// permanently with an error wrapping [ErrUnknownJobType], so the Worker
// dead-letters the job at its first delivery. The reason names the type,
// quoted and cut to [MaxTypeInReason] bytes: the type comes from the message
// and is untrusted.
func DeadLetterUnknown() Handler {
	return HandlerFunc(func(_ context.Context, d Delivery) error {
		return Permanent(unknownTypeError(d.Message().Type))
	})
}

// RetryUnknown returns an unknown-type handler for rolling deploys: it asks
// for the job to be delivered again after delay ([RetryAfter], wrapping
// [ErrUnknownJobType]). The Worker releases the delivery without consuming
// an attempt where the broker can (memory, RabbitMQ, PostgreSQL), so a job
// waits, circulating every delay, until a consumer that knows its type takes
// it; on SQS each return counts a receive, and the queue's maxReceiveCount
// dead-letters a type nobody learns. A delay <= 0 means 30s.
//
// Use it while producers may be ahead of consumers, and watch the retry_after
// settlements: a type that no consumer will ever know (a typo, a retired
// type) circulates until it is registered or the Router is switched back to
// [DeadLetterUnknown].
func RetryUnknown(delay time.Duration) Handler {
	if delay <= 0 {
		delay = 30 * time.Second
	}
	return HandlerFunc(func(_ context.Context, d Delivery) error {
		return RetryAfter(unknownTypeError(d.Message().Type), delay)
	})
}

// MaxTypeInReason bounds, in bytes, the job type quoted in an unknown-type
// error (before quoting).
const MaxTypeInReason = 128

func unknownTypeError(t string) error {
	return fmt.Errorf("%w %s", ErrUnknownJobType, quoteType(t))
}

// quoteType renders an untrusted job type for errors and logs: valid UTF-8,
// at most MaxTypeInReason bytes (an ellipsis marks a cut), and Go-quoted so
// that control characters and terminal escapes are shown, never obeyed.
func quoteType(t string) string {
	t = strings.ToValidUTF8(t, "\uFFFD")
	if len(t) > MaxTypeInReason {
		cut := MaxTypeInReason
		for cut > 0 && !utf8.RuneStart(t[cut]) {
			cut--
		}
		t = t[:cut] + "…"
	}
	return fmt.Sprintf("%q", t)
}
