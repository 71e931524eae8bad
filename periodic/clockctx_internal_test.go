package periodic

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestClockCtxOfDoneParent: a timeout on an ended context ends at once
// with the parent's error (AfterFunc's func runs on its own goroutine
// while the context is being made).
func TestClockCtxOfDoneParent(t *testing.T) {
	for range 200 {
		parent, cancel := context.WithCancel(context.Background())
		cancel()
		c := NewFakeClock(time.Unix(0, 0))
		ctx, stop := c.timeout(parent, time.Second)
		<-ctx.Done()
		if !errors.Is(ctx.Err(), context.Canceled) {
			t.Fatalf("Err %v, want context.Canceled", ctx.Err())
		}
		stop()
	}
}
