package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthq/berth/idempotency"
	"github.com/berthq/berth/sdk"
)

// jobType is the type of the charge jobs.
const jobType = "billing.charge"

// chargeJob is the payload of a charge job.
type chargeJob struct {
	OrderID     string `json:"order_id"`
	AmountCents int    `json:"amount_cents"`
}

// chargeKey is the idempotency key of charging an order: the business
// operation, not the message.
func chargeKey(orderID string) string { return "charge:" + orderID + ":v1" }

// errInjected is the transient failure the scenario injects.
var errInjected = errors.New("payment gateway: 503 service unavailable (injected)")

// chargeHandler is steps 5 to 8 of the safe worker flow; the Worker (steps 1,
// 2, 9, 10), the lock middleware (3) and the idempotency guard (4) wrap it.
type chargeHandler struct {
	ledger ledger
	// failRate is the probability of an injected transient failure on the
	// first two attempts (after the charge was written, so it is rolled back).
	failRate float64
	mu       sync.Mutex
	rng      *rand.Rand
	injected atomic.Int64
	already  atomic.Int64
}

func (h *chargeHandler) fail(attempt int) bool {
	if attempt > 2 || h.failRate <= 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rng.Float64() < h.failRate
}

func (h *chargeHandler) handle(ctx context.Context, d sdk.Delivery, job chargeJob) error {
	if job.OrderID == "" || job.AmountCents <= 0 {
		return sdk.Permanent(fmt.Errorf("invalid charge job: order %q, amount %d", job.OrderID, job.AmountCents))
	}
	key, _ := idempotency.KeyFrom(ctx)
	// 5. Load the order FOR UPDATE in the idempotency transaction.
	o, err := h.ledger.LoadForUpdate(ctx, job.OrderID)
	if errors.Is(err, errOrderNotFound) {
		return sdk.Permanent(fmt.Errorf("order %s: %w", job.OrderID, err))
	}
	if err != nil {
		return err
	}
	// 6. Validate. Already charged (by another key, say v0): record it, ack.
	if !o.ChargedAt.IsZero() {
		h.already.Add(1)
		idempotency.SetResult(ctx, result(o.ID, "already_charged"))
		return nil
	}
	if job.AmountCents != o.AmountCents {
		return sdk.Permanent(fmt.Errorf("order %s: job amount %d does not match the order's %d", o.ID, job.AmountCents, o.AmountCents))
	}
	// 7 and 8. Charge, update the order (status, charged_at, version+1) and,
	// through the guard, the job result: one transaction.
	if err := h.ledger.Charge(ctx, o, key); err != nil {
		return err
	}
	if h.fail(d.Attempt()) {
		h.injected.Add(1)
		return errInjected // 10. transient: rolled back, retried with backoff
	}
	idempotency.SetResult(ctx, result(o.ID, "charged"))
	return nil
}

func result(orderID, outcome string) idempotency.Result {
	b, _ := json.Marshal(map[string]string{"outcome": outcome})
	return idempotency.Result{ResourceType: "order", ResourceID: orderID, JSON: b}
}

// orderLocks is step 3, the optional resource lock: one holder per order in
// this process; a busy order is retried shortly. An efficiency tool (it saves
// blocked transactions), not a correctness tool: the row lock and the
// idempotency key are.
type orderLocks struct {
	mu   sync.Mutex
	held map[string]bool
	busy atomic.Int64
}

func (l *orderLocks) middleware(next sdk.Handler) sdk.Handler {
	return sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		res := "order:" + orderOf(d.Message().IdempotencyKey)
		l.mu.Lock()
		if l.held[res] {
			l.mu.Unlock()
			l.busy.Add(1)
			return sdk.RetryAfter(fmt.Errorf("%s is locked", res), 20*time.Millisecond)
		}
		l.held[res] = true
		l.mu.Unlock()
		defer func() {
			l.mu.Lock()
			delete(l.held, res)
			l.mu.Unlock()
		}()
		return next.Handle(ctx, d)
	})
}

// orderOf extracts the order from a key "charge:<order>:v1".
func orderOf(key string) string {
	parts := strings.Split(key, ":")
	if len(parts) == 3 {
		return parts[1]
	}
	return key
}
