package sdk

import (
	"context"
	"testing"
	"time"
)

type idleSubscriber struct{}

func (idleSubscriber) Receive(ctx context.Context, _ string, _ int) ([]Delivery, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestHardening14_DrainDefaultsFitGracePeriod checks that a Worker with
// default options stops within Kubernetes' default 30s grace period: the
// drain deadline, the grace for handlers that ignore cancellation
// (SettleTimeout + 1s) and the final Flush (SettleTimeout) together. The
// old defaults (30s + 10s + 1s + 10s) overran it, so SIGKILL arrived before
// in-flight deliveries were released.
func TestHardening14_DrainDefaultsFitGracePeriod(t *testing.T) {
	const grace = 30 * time.Second
	w, err := NewWorker(idleSubscriber{}, HandlerFunc(func(context.Context, Delivery) error { return nil }), WorkerOptions{Queue: "q"})
	if err != nil {
		t.Fatal(err)
	}
	o := w.opts
	worst := o.DrainTimeout + o.SettleTimeout + time.Second + o.SettleTimeout
	if worst >= grace {
		t.Errorf("default shutdown takes up to %s (DrainTimeout %s + SettleTimeout %s + 1s + Flush %s): not inside a %s grace period",
			worst, o.DrainTimeout, o.SettleTimeout, o.SettleTimeout, grace)
	}
	if o.SettleTimeout < time.Second {
		t.Errorf("default SettleTimeout %s leaves a settlement no time on a loaded broker", o.SettleTimeout)
	}
}
