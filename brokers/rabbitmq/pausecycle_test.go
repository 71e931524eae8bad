package rabbitmq

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
)

// TestPauseCyclesLeakNoGoroutine: each pause (StopReceiving) and resume
// (the next Receive) of a consumer starts a new basic.consume on the same
// channel. amqp091's ConsumeWithContext starts a goroutine per call that
// lives until its ctx ends or the channel closes; with the session's ctx
// every cycle left one behind for as long as the channel lived (days, for
// a Worker paused and resumed by an operator or a schedule).
func TestPauseCyclesLeakNoGoroutine(t *testing.T) {
	_, q, b := brokerOnQueue(t, Options{Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	// receive starts or resumes the consumer and returns once it waited a
	// little: the queue is empty.
	receive := func() {
		rctx, rcancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer rcancel()
		if _, err := b.Receive(rctx, q, 1); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Receive on an empty queue: %v", err)
		}
	}
	cycle := func() {
		receive()
		if err := b.StopReceiving(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 { // warm up: the consumer's goroutines, the channel's
		cycle()
	}
	before := runtime.NumGoroutine()
	const cycles = 20
	for range cycles {
		cycle()
	}
	receive()
	// Allow for goroutines that come and go (timers' AfterFuncs, the
	// connection's): a leak is one per cycle.
	deadline := time.Now().Add(5 * time.Second)
	for {
		after := runtime.NumGoroutine()
		if after < before+cycles/2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pause/resume cycles left %d goroutines behind (%d before, %d after)", cycles, after-before, before, after)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
