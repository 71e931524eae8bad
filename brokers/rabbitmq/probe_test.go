package rabbitmq

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestQueueArgumentsProbe reads back the arguments berth declares, for a
// quorum and a classic queue, and never creates a missing queue.
func TestQueueArgumentsProbe(t *testing.T) {
	for _, qt := range []QueueType{Quorum, Classic} {
		t.Run(string(qt), func(t *testing.T) {
			url := serverURL(t)
			b := newBroker(t, url, Options{QueueType: qt, MaxDeliveries: 7})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			q := testQueue(t, url)
			if err := b.DeclareQueue(ctx, q); err != nil {
				t.Fatal(err)
			}
			args, err := b.QueueArguments(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			want := b.mainArgs(q)
			if qt == Classic {
				delete(want, "x-queue-type") // the default: a redeclare without it is equivalent
			}
			for k, v := range want {
				if args[k] != v {
					t.Errorf("%s = %#v, want %#v (all: %v)", k, args[k], v, args)
				}
			}
			missing := q + "_missing"
			if _, err := b.QueueArguments(ctx, missing); !errors.Is(err, sdk.ErrNotFound) {
				t.Errorf("QueueArguments of a missing queue: %v, want ErrNotFound", err)
			}
			if _, err := b.inspect(ctx, missing); !errors.Is(err, sdk.ErrNotFound) {
				t.Errorf("the probe created %s: %v", missing, err)
			}
		})
	}
}
