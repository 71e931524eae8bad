package brokertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// ctx returns a context bounded by the harness timeout, cancelled with the test.
func (e *env) ctx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), e.h.Timeout)
	t.Cleanup(cancel)
	return ctx
}

// publish publishes msgs to the case's queue and fails the test on error.
func (e *env) publish(t *testing.T, msgs ...*sdk.Message) {
	t.Helper()
	if err := e.b.Publish(e.ctx(t), e.q, msgs...); err != nil {
		t.Fatalf("Publish: %v", err)
	}
}

// receive waits, within the harness timeout, for at least one delivery and
// returns what one Receive call gave (at most max).
func (e *env) receive(t *testing.T, max int) []sdk.Delivery {
	t.Helper()
	return e.receiveOn(t, e.b, e.q, max)
}

// receiveOn is receive from queue q of broker b.
func (e *env) receiveOn(t *testing.T, b sdk.Broker, q string, max int) []sdk.Delivery {
	t.Helper()
	ctx := e.ctx(t)
	for {
		ds, err := b.Receive(ctx, q, max)
		if err != nil {
			t.Fatalf("Receive: %v (nothing delivered within %s)", err, e.h.Timeout)
		}
		if len(ds) > max {
			t.Fatalf("Receive(max=%d) returned %d deliveries", max, len(ds))
		}
		if len(ds) > 0 {
			return ds
		}
	}
}

// receiveOne waits for one delivery.
func (e *env) receiveOne(t *testing.T) sdk.Delivery {
	t.Helper()
	return e.receive(t, 1)[0]
}

// receiveN waits for exactly n deliveries, in as many calls as it takes.
func (e *env) receiveN(t *testing.T, n int) []sdk.Delivery {
	t.Helper()
	return e.receiveNOn(t, e.b, e.q, n)
}

// receiveNOn is receiveN from queue q of broker b.
func (e *env) receiveNOn(t *testing.T, b sdk.Broker, q string, n int) []sdk.Delivery {
	t.Helper()
	var all []sdk.Delivery
	for len(all) < n {
		all = append(all, e.receiveOn(t, b, q, n-len(all))...)
	}
	return all
}

// receiveEach waits for exactly n deliveries and calls each on every one as
// it comes, so that the case settles each within its own lease. Deliveries
// held until all n have come could outlive their leases while a Receive
// answer the server lost hides the rest for a lease
// ([Harness.LostReceives]).
func (e *env) receiveEach(t *testing.T, n int, each func(sdk.Delivery)) {
	t.Helper()
	e.receiveEachOn(t, e.b, e.q, n, each)
}

// receiveEachOn is receiveEach from queue q of broker b.
func (e *env) receiveEachOn(t *testing.T, b sdk.Broker, q string, n int, each func(sdk.Delivery)) {
	t.Helper()
	for got := 0; got < n; {
		ds := e.receiveOn(t, b, q, n-got)
		for _, d := range ds {
			each(d)
		}
		got += len(ds)
	}
}

// attemptIs reports whether a delivery's Attempt() got is want: exactly, or
// one more where the harness says the server may lose a Receive answer
// ([Harness.LostReceives]), which takes a delivery nobody saw.
func (e *env) attemptIs(got, want int) bool {
	return got == want || (got == want+1 && e.h.LostReceives != nil && e.h.LostReceives())
}

// expectNone receives for the duration wait and fails the test if anything
// is delivered.
func (e *env) expectNone(t *testing.T, wait time.Duration) {
	t.Helper()
	if err := expectNoneOn(t.Context(), e.b, e.q, wait); err != nil {
		t.Fatal(err)
	}
}

// expectNoneOn receives from queue q of b for the duration wait and returns
// an error naming what was delivered, if anything was.
func expectNoneOn(ctx context.Context, b sdk.Broker, q string, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		ds, err := b.Receive(ctx, q, 10)
		for _, d := range ds {
			return fmt.Errorf("unexpected delivery of %s (attempt %d) from %s", d.Message().ID, d.Attempt(), q)
		}
		if err != nil {
			if !errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("Receive on a quiet queue %s: %w, want the context's error", q, err)
			}
			return nil
		}
	}
}

// abandon lets go of d without settling it, as a consumer that died would.
func (e *env) abandon(t *testing.T, d sdk.Delivery) {
	t.Helper()
	if e.h.Abandon != nil {
		e.h.Abandon(t, e.b, d)
	}
}

// supports reports whether the harness declares capability c supported.
func (e *env) supports(c Capability) bool {
	_, unsupported := e.h.Unsupported[c]
	return !unsupported
}

// deadLetters returns the broker's DeadLetters or fails the test.
func (e *env) deadLetters(t *testing.T) sdk.DeadLetters {
	t.Helper()
	dl, ok := e.b.(sdk.DeadLetters)
	if !ok {
		t.Fatalf("%T does not implement sdk.DeadLetters; declare CapDeadLetters unsupported with a reason", e.b)
	}
	return dl
}

// waitDeadLetters waits until the queue's dead-letter queue holds n messages
// and returns them.
func (e *env) waitDeadLetters(t *testing.T, n int) []*sdk.Message {
	t.Helper()
	dl := e.deadLetters(t)
	ctx := e.ctx(t)
	for {
		ms, err := dl.ListDeadLetters(ctx, e.q, n+10)
		if err != nil {
			t.Fatalf("ListDeadLetters: %v", err)
		}
		if len(ms) == n {
			return ms
		}
		if len(ms) > n {
			t.Fatalf("ListDeadLetters: %d dead letters, want %d", len(ms), n)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("ListDeadLetters: %d dead letters after %s, want %d", len(ms), e.h.Timeout, n)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// settleAck acks d and fails the test on error.
func settleAck(t *testing.T, ctx context.Context, d sdk.Delivery) {
	t.Helper()
	if err := d.Ack(ctx); err != nil {
		t.Fatalf("Ack of %s (attempt %d): %v", d.Message().ID, d.Attempt(), err)
	}
}

// userHeaders returns h without the reserved "berth-" headers.
func userHeaders(h map[string]string) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		if !strings.HasPrefix(k, "berth-") {
			out[k] = v
		}
	}
	return out
}

// compareMessage reports how got differs from want in the fields a broker
// carries (ID, Type, IdempotencyKey, Key, CorrelationID, user headers, Body).
func compareMessage(t *testing.T, got, want *sdk.Message) {
	t.Helper()
	if got.ID != want.ID {
		t.Errorf("ID = %q, want %q", got.ID, want.ID)
	}
	if got.Type != want.Type {
		t.Errorf("message %s: Type = %q, want %q", want.ID, got.Type, want.Type)
	}
	if got.IdempotencyKey != want.IdempotencyKey {
		t.Errorf("message %s: IdempotencyKey = %q, want %q", want.ID, got.IdempotencyKey, want.IdempotencyKey)
	}
	if got.Key != want.Key {
		t.Errorf("message %s: Key = %q, want %q", want.ID, got.Key, want.Key)
	}
	if got.CorrelationID != want.CorrelationID {
		t.Errorf("message %s: CorrelationID = %q, want %q", want.ID, got.CorrelationID, want.CorrelationID)
	}
	if g, w := userHeaders(got.Headers), userHeaders(want.Headers); !maps.Equal(g, w) {
		t.Errorf("message %s: Headers = %q, want %q", want.ID, g, w)
	}
	if !bytes.Equal(got.Body, want.Body) {
		t.Errorf("message %s: Body = %x, want %x", want.ID, got.Body, want.Body)
	}
}

// textMessage returns a message with body s.
func textMessage(s string) *sdk.Message {
	return &sdk.Message{Type: "brokertest." + s, Body: []byte(s)}
}
