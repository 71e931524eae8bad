package sdk

import (
	"context"
	"fmt"
	"sort"
	"sync"
)

// Router is a Handler that dispatches by Message.Type. A type with no handler
// is a permanent failure wrapping [ErrUnknownJobType]: the job is
// dead-lettered with that reason, never redelivered in a loop.
//
// Handlers may be registered while the router serves; routes are read under a lock.
type Router struct {
	mu     sync.RWMutex
	routes map[string]Handler
}

// NewRouter returns an empty Router.
func NewRouter() *Router { return &Router{routes: make(map[string]Handler)} }

// Register routes jobType to h, replacing any previous handler.
func (r *Router) Register(jobType string, h Handler) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.routes[jobType] = h
}

// RegisterFunc routes jobType to f.
func (r *Router) RegisterFunc(jobType string, f func(ctx context.Context, d Delivery) error) {
	r.Register(jobType, HandlerFunc(f))
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

// Handle dispatches d to the handler of its type.
func (r *Router) Handle(ctx context.Context, d Delivery) error {
	t := d.Message().Type
	r.mu.RLock()
	h, ok := r.routes[t]
	r.mu.RUnlock()
	if !ok {
		return Permanent(fmt.Errorf("%w %q", ErrUnknownJobType, t))
	}
	return h.Handle(ctx, d)
}
