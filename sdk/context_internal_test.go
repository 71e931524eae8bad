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
