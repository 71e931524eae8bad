package postgres

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestWrapOwnTimeoutIsUnavailable checks wrap's rule for context errors: the
// caller's own (its ctx is done) comes back as is; one while the caller's
// ctx is live — the broker's own time limit ran out — wraps
// sdk.ErrUnavailable, the context error kept in the chain.
func TestWrapOwnTimeoutIsUnavailable(t *testing.T) {
	open := make(chan struct{})
	b := &Broker{closed: open, table: `"berth".jobs`}
	live := context.Background()
	done, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithTimeout(context.Background(), -time.Second)
	defer cancel2()
	timeout := fmt.Errorf("timeout: %w", context.DeadlineExceeded) // as pgconn reports it

	if err := b.wrap(live, "receive", timeout); !errors.Is(err, sdk.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("broker's own deadline, caller live: %v; want ErrUnavailable and DeadlineExceeded", err)
	}
	if err := b.wrap(live, "ack", context.Canceled); !errors.Is(err, sdk.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled under a live caller: %v; want ErrUnavailable and Canceled", err)
	}
	if err := b.wrap(expired, "receive", timeout); err != timeout {
		t.Errorf("caller's deadline: %v; want the error as is", err)
	}
	if err := b.wrap(done, "receive", context.Canceled); err != context.Canceled {
		t.Errorf("caller cancelled: %v; want the error as is", err)
	}
	closed := make(chan struct{})
	close(closed)
	cb := &Broker{closed: closed, table: `"berth".jobs`}
	if err := cb.wrap(live, "receive", timeout); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("closed broker: %v; want ErrClosed", err)
	}
}
