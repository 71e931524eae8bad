package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestQueueIdleWaitFloor: NewWorker (and CheckConfig) refuse a
// QueueIdleWait below 1ms with ErrInvalidOptions naming the field. Before,
// any positive value was taken: at 1ns every Receive of a Worker of several
// queues had its context done before it started, so it returned nothing
// (the memory broker checks its context first) and the Worker never ran a
// job. At the floor a Worker of several queues still runs its jobs.
func TestQueueIdleWaitFloor(t *testing.T) {
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })
	two := []sdk.WorkerQueue{{Name: "empty"}, {Name: "busy"}}
	for _, d := range []time.Duration{time.Nanosecond, time.Microsecond, time.Millisecond - 1} {
		for _, o := range []sdk.WorkerOptions{{Queues: two}, {Queue: "q"}} {
			o.QueueIdleWait, o.Logger = d, quiet
			_, err := sdk.NewWorker(newFakeSub(), h, o)
			if !errors.Is(err, sdk.ErrInvalidOptions) || !strings.Contains(fmt.Sprint(err), "QueueIdleWait") {
				t.Errorf("QueueIdleWait %s (%d queues): NewWorker = %v; want ErrInvalidOptions naming QueueIdleWait", d, max(len(o.Queues), 1), err)
			}
			if _, err := sdk.CheckConfig(newFakeSub(), o); !errors.Is(err, sdk.ErrInvalidOptions) {
				t.Errorf("QueueIdleWait %s: CheckConfig = %v; want ErrInvalidOptions", d, err)
			}
		}
	}

	b := newMem(t)
	fill(t, b, "busy", 20)
	sub := newCountingSub(b)
	w, err := sdk.NewWorker(sub, h, sdk.WorkerOptions{Concurrency: 1, Logger: mqQuiet(), QueueIdleWait: time.Millisecond, Queues: two})
	if err != nil {
		t.Fatalf("QueueIdleWait 1ms refused: %v", err)
	}
	runMQ(t, w)
	sub.waitReceived(t, 20)
}
