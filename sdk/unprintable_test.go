package sdk_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// nilPointerError is an error type whose Error method reads its receiver:
// a nil *nilPointerError panics when printed.
type nilPointerError struct{ code string }

func (e *nilPointerError) Error() string { return "code " + e.code }

// TestHandlerTypedNilErrorDoesNotEndTheProcess: a handler that returns a
// typed nil pointer as its error (var e *MyError; return e — non-nil as an
// error) made the settlement call its Error method: the memory broker's
// Retry, every broker's DeadLetter and the observers do, on the Worker's
// settlement path, where nothing recovers — the process died (SIGSEGV in
// memory's Retry). The job is now retried and dead-lettered like any
// failure, its reason naming the error's type.
func TestHandlerTypedNilErrorDoesNotEndTheProcess(t *testing.T) {
	b, err := memory.New(memory.Options{MaxDeliveries: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const queue = "typednil"
	m := &sdk.Message{Type: "t", Body: []byte("x")}
	if err := b.Publish(ctx, queue, m); err != nil {
		t.Fatal(err)
	}
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error {
		var e *nilPointerError
		return e
	})
	w, err := sdk.NewWorker(b, h, sdk.WorkerOptions{Queue: queue, Retry: sdk.RetryPolicy{MaxAttempts: 2, Backoff: sdk.Backoff{Base: time.Millisecond, Max: time.Millisecond}}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	for {
		dls, err := b.ListDeadLetters(ctx, queue, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(dls) == 1 {
			reason := dls[0].Header(sdk.HeaderDeadLetterReason)
			if dls[0].ID != m.ID || !strings.Contains(reason, "*sdk_test.nilPointerError") {
				t.Errorf("dead letter %s, reason %q; want %s with a reason naming *sdk_test.nilPointerError", dls[0].ID, reason, m.ID)
			}
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("the job was never dead-lettered")
		case <-time.After(10 * time.Millisecond):
		}
	}
}
