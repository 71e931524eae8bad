package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
)

type guardKey struct{}

// running is what the guard puts in the handler's context.
type running struct {
	key string
	mu  sync.Mutex
	res Result
}

// KeyFrom returns the idempotency key of the operation the handler runs
// under, to pass on to an external API (lease mode), and whether there is one.
func KeyFrom(ctx context.Context) (string, bool) {
	r, ok := ctx.Value(guardKey{}).(*running)
	if !ok {
		return "", false
	}
	return r.key, true
}

// SetResult records the result the guard stores with the key when the handler
// returns nil. It reports false, and records nothing, when ctx does not come
// from the idempotency middleware or an [Inbox], or when res.JSON is set but
// is not valid JSON: a store that refuses it at completion (PostgreSQL's
// jsonb) would leave a lease-mode claim in progress, and the redelivery that
// takes it over would apply the effect again. res.JSON is copied.
func SetResult(ctx context.Context, res Result) bool {
	r, ok := ctx.Value(guardKey{}).(*running)
	if !ok {
		return false
	}
	if res.JSON != nil {
		if !json.Valid(res.JSON) {
			return false
		}
		res.JSON = bytes.Clone(res.JSON)
	}
	r.mu.Lock()
	r.res = res
	r.mu.Unlock()
	return true
}

func (r *running) result() Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.res
}
