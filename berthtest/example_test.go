package berthtest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/sdk"
)

// A handler's result, settled by the Worker's own rules, without a broker.
func ExampleWork() {
	t := &testing.T{} // in a test, the test's own t
	charge := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		if len(d.Message().Body) == 0 {
			return sdk.Permanent(errors.New("empty order"))
		}
		return nil
	})
	res := berthtest.Work(t, charge, &sdk.Message{Type: "billing.charge"})
	fmt.Println(res.Action, res.Class, res.Reason)
	res = berthtest.Work(t, charge, &sdk.Message{Type: "billing.charge", Body: []byte(`{"order":"o1"}`)})
	fmt.Println(res.Action)
	// Output:
	// dead_letter permanent permanent: empty order
	// ack
}

// A Worker on the in-memory broker, and a wait for its settlements instead
// of a sleep. (In a test function: t is the test's.)
func ExampleStartWorker() {
	var t *testing.T
	b := berthtest.Memory(t)
	rec := berthtest.StartWorker(t, b, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }),
		sdk.WorkerOptions{Queue: "emails"})
	_ = b.Publish(context.Background(), "emails", &sdk.Message{Type: "email.welcome"}, &sdk.Message{Type: "email.receipt"})
	for _, r := range rec.WaitDone(t, 2) {
		fmt.Println(r.Message.Type, r.Action)
	}
}
