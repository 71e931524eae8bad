package sdk

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestDetachedContext checks that detach behaves as context.WithoutCancel:
// values pass through; the parent's cancellation, deadline and cause do
// not; and a cancellable child of it has its own cause.
func TestDetachedContext(t *testing.T) {
	if cancelCauseKey == nil {
		t.Fatal("the key context.Cause looks up was not learnt")
	}
	type key struct{}
	cause := errors.New("parent stopped")
	parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), key{}, "v"))
	parent, stop := context.WithTimeout(parent, time.Hour)
	defer stop()
	cancel(cause)

	d := detach(parent)
	if d.Err() != nil || d.Done() != nil {
		t.Fatalf("detached context is cancelled: %v", d.Err())
	}
	if _, ok := d.Deadline(); ok {
		t.Fatal("detached context has the parent's deadline")
	}
	if got := context.Cause(d); got != nil {
		t.Fatalf("Cause of the detached context = %v, want nil (as WithoutCancel)", got)
	}
	if got := d.Value(key{}); got != "v" {
		t.Fatalf("Value = %v, want the parent's", got)
	}

	child, cancelChild := context.WithCancelCause(d)
	if child.Err() != nil {
		t.Fatal("child of a detached context starts cancelled")
	}
	mine := errors.New("mine")
	cancelChild(mine)
	if got := context.Cause(child); got != mine {
		t.Fatalf("Cause of the child = %v, want %v", got, mine)
	}
	if got := context.Cause(context.WithoutCancel(parent)); got != nil {
		t.Fatalf("reference: Cause(WithoutCancel) = %v", got)
	}
}

// TestHandlerContext checks that the handler's context behaves as one made
// by context.WithCancelCause: Err, Done and Cause; contexts derived before
// and after cancellation are cancelled with the cause; context.AfterFunc
// runs or is stopped; values pass through.
func TestHandlerContext(t *testing.T) {
	type key struct{}
	c := &handlerCtx{parent: detach(context.WithValue(context.Background(), key{}, "v"))}
	if c.Err() != nil || context.Cause(c) != nil {
		t.Fatal("cancelled at birth")
	}
	if c.Value(key{}) != "v" {
		t.Fatal("value lost")
	}
	before, stopBefore := context.WithTimeout(c, time.Hour)
	defer stopBefore()
	detached := context.WithoutCancel(c)
	ran := make(chan struct{})
	context.AfterFunc(c, func() { close(ran) })
	stopped := context.AfterFunc(c, func() { t.Error("stopped AfterFunc ran") })
	if !stopped() {
		t.Fatal("AfterFunc not stopped")
	}
	select {
	case <-c.Done():
		t.Fatal("done before cancel")
	default:
	}

	cause := errors.New("lease lost")
	c.cancel(cause)
	c.cancel(errors.New("second")) // ignored
	<-c.Done()
	if !errors.Is(c.Err(), context.Canceled) || context.Cause(c) != cause {
		t.Fatalf("Err %v Cause %v", c.Err(), context.Cause(c))
	}
	<-before.Done() // synchronously, in fact
	if context.Cause(before) != cause {
		t.Fatalf("child made before: Cause %v", context.Cause(before))
	}
	<-ran
	after, stopAfter := context.WithCancel(c)
	defer stopAfter()
	<-after.Done()
	if context.Cause(after) != cause {
		t.Fatalf("child made after: Cause %v", context.Cause(after))
	}
	if detached.Err() != nil {
		t.Fatal("WithoutCancel child cancelled")
	}

	plain := &handlerCtx{parent: detach(context.Background())}
	plain.Done()
	plain.cancel(nil)
	if context.Cause(plain) != context.Canceled {
		t.Fatalf("cancel(nil): Cause %v, want context.Canceled", context.Cause(plain))
	}
}
