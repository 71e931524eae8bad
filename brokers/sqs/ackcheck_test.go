package sqs_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// TestBufferedAckAfterLeaseLost: an Ack made within the lease whose
// buffered delete is sent after the lease ran out and another receiver took
// the message again is reported lost. SQS (and the emulator) answer success
// to a delete with the old receipt handle and delete nothing: Ack and Flush
// returned nil while the message ran again.
func TestBufferedAckAfterLeaseLost(t *testing.T) {
	ctx := testCtx(t)
	// AckInterval of an hour: only the Flush sends the delete, after the
	// second receiver holds the message.
	b1 := newBroker(t, sqs.Options{VisibilityTimeout: time.Second, WaitTime: time.Second, AckInterval: time.Hour})
	b2 := newBroker(t, sqs.Options{VisibilityTimeout: 30 * time.Second, WaitTime: time.Second, SyncAck: true})
	q := declare(t, b1, "acklost", false, sqs.QueueConfig{})
	m := &sdk.Message{Body: []byte("x")}
	if err := b1.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	d1 := receiveN(t, b1, q, 1)[0]
	if err := d1.Ack(ctx); err != nil { // within the lease: buffered
		t.Fatalf("Ack: %v", err)
	}
	d2 := receiveN(t, b2, q, 1)[0] // comes once the first lease ran out
	if d2.Message().ID != m.ID || d2.Attempt() < 2 {
		t.Fatalf("second receive: message %s attempt %d, want %s attempt >= 2", d2.Message().ID, d2.Attempt(), m.ID)
	}
	err := b1.Flush(ctx)
	var ae *sqs.AckError
	if !errors.As(err, &ae) || ae.ID != m.ID || !errors.Is(err, sdk.ErrLeaseLost) {
		t.Fatalf("Flush = %v, want an AckError of %s wrapping ErrLeaseLost", err, m.ID)
	}
	// The second receipt still holds the message.
	if err := d2.ExtendLease(ctx, 0); err != nil {
		t.Fatalf("ExtendLease of the second delivery: %v", err)
	}
	if err := d2.Ack(ctx); err != nil {
		t.Fatalf("Ack of the second delivery: %v", err)
	}
}

// fakeCalls counts the calls of a fake SQS by operation and keeps the
// receipt handles of the batch calls.
type fakeCalls struct {
	mu      sync.Mutex
	ops     map[string]int
	handles map[string][][]string
}

func (c *fakeCalls) record(op string, req map[string]any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ops[op]++
	if entries, ok := req["Entries"].([]any); ok {
		var hs []string
		for _, e := range entries {
			hs = append(hs, e.(map[string]any)["ReceiptHandle"].(string))
		}
		c.handles[op] = append(c.handles[op], hs)
	}
}

func newFakeCalls() *fakeCalls {
	return &fakeCalls{ops: map[string]int{}, handles: map[string][][]string{}}
}

// TestBufferedAckWithinLeaseNoCheck: a buffered delete sent well within its
// lease costs no lease check.
func TestBufferedAckWithinLeaseNoCheck(t *testing.T) {
	calls := newFakeCalls()
	client := newFakeSQS(t, func(op string, n int, req map[string]any) string {
		calls.record(op, req)
		if s, ok := fakeCommon(op); ok {
			return s
		}
		if op == "DeleteMessageBatch" {
			return `{"Successful":[{"Id":"0"},{"Id":"1"}],"Failed":[]}`
		}
		return `{}`
	})
	b, ctx, ds := fakeReceive(t, client, sqs.Options{WaitTime: time.Second}, 10, 2) // a 30 s lease
	for _, d := range ds {
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	calls.mu.Lock()
	defer calls.mu.Unlock()
	if n := calls.ops["ChangeMessageVisibility"] + calls.ops["ChangeMessageVisibilityBatch"]; n != 0 {
		t.Errorf("%d visibility calls, want none", n)
	}
	if got := calls.handles["DeleteMessageBatch"]; len(got) != 1 || len(got[0]) != 2 {
		t.Errorf("DeleteMessageBatch calls %v, want one of h0 and h1", got)
	}
}

// TestBufferedAckPastLeaseChecked: buffered deletes sent after their lease
// ran out are checked first; a stale receipt is not deleted and is reported
// lost, a check SQS failed on its side is made again, and a confirmed one
// is deleted.
func TestBufferedAckPastLeaseChecked(t *testing.T) {
	calls := newFakeCalls()
	client := newFakeSQS(t, func(op string, n int, req map[string]any) string {
		calls.record(op, req)
		if s, ok := fakeCommon(op); ok {
			return s
		}
		switch op {
		case "ChangeMessageVisibilityBatch":
			if n == 1 { // h0: SQS's fault, checked again; h1: stale
				return `{"Successful":[],"Failed":[` +
					`{"Id":"0","Code":"InternalError","Message":"try again","SenderFault":false},` +
					`{"Id":"1","Code":"ReceiptHandleIsInvalid","Message":"The input receipt handle is invalid.","SenderFault":true}]}`
			}
			return `{"Successful":[{"Id":"0"}],"Failed":[]}`
		case "DeleteMessageBatch":
			return `{"Successful":[{"Id":"0"}],"Failed":[]}`
		}
		return `{}`
	})
	b, ctx, ds := fakeReceive(t, client, sqs.Options{VisibilityTimeout: time.Second, WaitTime: time.Second, AckInterval: time.Hour}, 10, 2)
	for _, d := range ds {
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(1100 * time.Millisecond) // the leases run out while the deletes are buffered
	err := b.Flush(ctx)
	var ae *sqs.AckError
	if !errors.As(err, &ae) || ae.ID != "m1" || !errors.Is(err, sdk.ErrLeaseLost) {
		t.Fatalf("Flush = %v, want the AckError of m1 wrapping ErrLeaseLost", err)
	}
	if strings.Contains(err.Error(), "m0") {
		t.Errorf("Flush reported m0, whose check succeeded on retry: %v", err)
	}
	calls.mu.Lock()
	defer calls.mu.Unlock()
	checks := calls.handles["ChangeMessageVisibilityBatch"]
	if len(checks) != 2 || len(checks[0]) != 2 || len(checks[1]) != 1 || checks[1][0] != "h0" {
		t.Errorf("ChangeMessageVisibilityBatch calls %v, want [h0 h1] then [h0]", checks)
	}
	if got := calls.handles["DeleteMessageBatch"]; len(got) != 1 || len(got[0]) != 1 || got[0][0] != "h0" {
		t.Errorf("DeleteMessageBatch calls %v, want one of h0 only", got)
	}
}

// TestDeleteRetriedPastLeaseIsNotSuccess: a buffered delete sent well within
// its lease whose first attempt fails (the connection, here) is sent again by
// the SDK's retries, after the lease ran out and another receiver took the
// message. SQS (and the emulator) answer success to the old receipt and
// delete nothing: the lease check before the call does not cover an attempt
// made that late, and Flush returned nil while the message ran again. Its
// outcome is now unknown (sdk.ErrUnavailable), never success.
func TestDeleteRetriedPastLeaseIsNotSuccess(t *testing.T) {
	ctx := testCtx(t)
	started, proceed := make(chan struct{}), make(chan struct{})
	var attempts atomic.Int32
	failFirst := onOperationAt(eachAttempt, "DeleteMessageBatch", func(ctx context.Context) error {
		if attempts.Add(1) > 1 {
			return nil
		}
		close(started)
		select { // until the lease ran out and another receiver holds the message
		case <-proceed:
		case <-ctx.Done():
			return ctx.Err()
		}
		return &smithyhttp.RequestSendError{Err: errors.New("connection reset (injected)")}
	})
	b1 := newBroker(t, sqs.Options{VisibilityTimeout: time.Second, WaitTime: time.Second}, failFirst)
	b2 := newBroker(t, sqs.Options{VisibilityTimeout: 30 * time.Second, WaitTime: time.Second, SyncAck: true})
	q := declare(t, b1, "ackretry", false, sqs.QueueConfig{})
	m := &sdk.Message{Body: []byte("x")}
	if err := b1.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	d1 := receiveN(t, b1, q, 1)[0]
	if err := d1.Ack(ctx); err != nil { // well within the lease: sent with no check
		t.Fatalf("Ack: %v", err)
	}
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the delete was not sent")
	}
	d2 := receiveN(t, b2, q, 1)[0] // comes once the first lease ran out
	if d2.Message().ID != m.ID || d2.Attempt() < 2 {
		t.Fatalf("second receive: message %s attempt %d, want %s attempt >= 2", d2.Message().ID, d2.Attempt(), m.ID)
	}
	close(proceed)
	err := b1.Flush(ctx)
	if n := attempts.Load(); n < 2 {
		t.Fatalf("%d DeleteMessageBatch attempts, want the SDK's retry", n)
	}
	// The second receipt still holds the message: the retried delete
	// deleted nothing.
	if err := d2.ExtendLease(ctx, 0); err != nil {
		t.Fatalf("ExtendLease of the second delivery: %v", err)
	}
	var ae *sqs.AckError
	if !errors.As(err, &ae) || ae.ID != m.ID || !errors.Is(err, sdk.ErrUnavailable) {
		t.Errorf("Flush = %v, want an AckError of %s wrapping ErrUnavailable (the message was not deleted)", err, m.ID)
	}
	if err := d2.Ack(ctx); err != nil {
		t.Fatalf("Ack of the second delivery: %v", err)
	}
}
