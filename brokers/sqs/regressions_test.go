package sqs_test

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// TestSharedPublishSameIDOutcomeByEntry: two concurrent Publish calls of
// messages with the same ID share one SendMessageBatch; SQS refuses the
// first's entry and accepts the second's. Each Publish gets its own entry's
// outcome: the second returns nil (it would otherwise publish again, a
// duplicate), the first the refusal.
func TestSharedPublishSameIDOutcomeByEntry(t *testing.T) {
	release := make(chan struct{})
	var shared atomic.Int32 // entries of the call that carried both
	client := newFakeSQS(t, func(op string, n int, req map[string]any) string {
		if s, ok := fakeCommon(op); ok {
			return s
		}
		if op != "SendMessageBatch" {
			return `{}`
		}
		if n == 1 { // holds the only sender while the others queue
			<-release
			return `{"Successful":[{"Id":"0","MessageId":"a","MD5OfMessageBody":"x"}],"Failed":[]}`
		}
		// Refuse the entry from A, accept every other.
		es := req["Entries"].([]any)
		shared.Store(int32(len(es)))
		var ok, failed []string
		for _, e := range es {
			m := e.(map[string]any)
			id := m["Id"].(string)
			if m["MessageBody"] == "from A" {
				failed = append(failed, `{"Id":"`+id+`","Code":"InvalidParameterValue","Message":"refused","SenderFault":true}`)
			} else {
				ok = append(ok, `{"Id":"`+id+`","MessageId":"m`+id+`","MD5OfMessageBody":"x"}`)
			}
		}
		return `{"Successful":[` + strings.Join(ok, ",") + `],"Failed":[` + strings.Join(failed, ",") + `]}`
	})
	b, err := sqs.New(client, sqs.Options{PublishSenders: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := testCtx(t)
	first := make(chan error, 1)
	go func() { first <- b.Publish(ctx, "q", &sdk.Message{ID: "blocker", Body: []byte("first")}) }()
	waitQueued := func(n int) {
		t.Helper()
		for sqs.QueuedShared(b) != n {
			if ctx.Err() != nil {
				t.Fatalf("%d entries queued, want %d", sqs.QueuedShared(b), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitQueued(0)                     // the blocker was taken
	time.Sleep(50 * time.Millisecond) // and its call is in flight
	errA, errB := make(chan error, 1), make(chan error, 1)
	go func() { errA <- b.Publish(ctx, "q", &sdk.Message{ID: "same", Body: []byte("from A")}) }()
	waitQueued(1)
	go func() { errB <- b.Publish(ctx, "q", &sdk.Message{ID: "same", Body: []byte("from B")}) }()
	waitQueued(2)
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("blocker: %v", err)
	}
	a, bErr := <-errA, <-errB
	if got := shared.Load(); got != 2 {
		t.Fatalf("the second call carried %d entries, want A's and B's", got)
	}
	if bErr != nil {
		t.Errorf("B's entry was accepted by SQS but its Publish returned %v", bErr)
	}
	var pe *sdk.PublishError
	var ee *sqs.EntryError
	if !errors.As(a, &pe) || pe.Failed["same"] == nil || !errors.As(pe.Failed["same"], &ee) || ee.Code != "InvalidParameterValue" {
		t.Errorf("A's entry was refused but its Publish returned %v, want a PublishError with the refusal", a)
	}
}

// TestStaleDeleteIsLeaseLost: a delete that SQS refuses because the receipt
// handle expired wraps sdk.ErrLeaseLost, from a SyncAck Ack and from
// DeadLetter; the acked delivery is lost, not settled, and DeadLetter takes
// its copy back out of the dead-letter queue.
func TestStaleDeleteIsLeaseLost(t *testing.T) {
	var deletes, withdrawn atomic.Int32
	client := newFakeSQS(t, func(op string, n int, req map[string]any) string {
		switch op {
		case "ReceiveMessage":
			switch n {
			case 1: // the queue
			case 2: // the dead-letter queue, scanned for the copy
				return `{"Messages":[{"MessageId":"dl","ReceiptHandle":"hdl","Body":"b","Attributes":{"ApproximateReceiveCount":"1"}}]}`
			default:
				return `{"Messages":[]}`
			}
		case "DeleteMessageBatch":
			if e := req["Entries"].([]any); len(e) == 1 && e[0].(map[string]any)["ReceiptHandle"] == "hdl" {
				withdrawn.Add(1)
				return `{"Successful":[{"Id":"0"}],"Failed":[]}`
			}
			deletes.Add(1)
			return `{"Successful":[],"Failed":[{"Id":"0","Code":"ReceiptHandleIsInvalid","Message":"The receipt handle has expired","SenderFault":true}]}`
		case "SendMessageBatch": // the dead-letter copy
			return `{"Successful":[{"Id":"0","MessageId":"dl","MD5OfMessageBody":"x"}],"Failed":[]}`
		}
		if s, ok := fakeCommon(op); ok {
			return s
		}
		return `{}`
	})
	_, ctx, ds := fakeReceive(t, client, sqs.Options{WaitTime: time.Second, SyncAck: true}, 2, 2)
	err := ds[0].Ack(ctx)
	var ae *sqs.AckError
	var ee *sqs.EntryError
	if !errors.Is(err, sdk.ErrLeaseLost) || !errors.As(err, &ae) || !errors.As(err, &ee) || ee.Code != "ReceiptHandleIsInvalid" {
		t.Errorf("Ack refused with a stale receipt handle: %v, want an AckError wrapping sdk.ErrLeaseLost and the EntryError", err)
	}
	if err := ds[0].Ack(ctx); !errors.Is(err, sdk.ErrLeaseLost) {
		t.Errorf("second Ack after a stale delete: %v, want ErrLeaseLost", err)
	}
	if err := ds[1].DeadLetter(ctx, errors.New("bad")); !errors.Is(err, sdk.ErrLeaseLost) {
		t.Errorf("DeadLetter whose delete was refused with a stale receipt handle: %v, want ErrLeaseLost", err)
	}
	if n := deletes.Load(); n != 2 {
		t.Errorf("%d DeleteMessageBatch calls, want 2 (a stale entry is not sent again)", n)
	}
	if n := withdrawn.Load(); n != 1 {
		t.Errorf("the dead letter's copy was deleted %d times, want once (taken back: the original's lease was lost)", n)
	}
}

// deleteFailServer is an SQS fake that answers the calls fakeCommon knows,
// accepts every SendMessageBatch, and fails DeleteMessageBatch with fail.
func deleteFailServer(t *testing.T, fail func(w http.ResponseWriter)) *awssqs.Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		op := strings.TrimPrefix(r.Header.Get("X-Amz-Target"), "AmazonSQS.")
		_, _ = io.ReadAll(r.Body)
		if op == "DeleteMessageBatch" {
			fail(w)
			return
		}
		s, ok := fakeCommon(op)
		if !ok {
			s = `{}`
		}
		if op == "SendMessageBatch" {
			s = `{"Successful":[{"Id":"0","MessageId":"dl","MD5OfMessageBody":"x"}],"Failed":[]}`
		}
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		_, _ = io.WriteString(w, s)
	}))
	return fakeClient(t, srv)
}

// cutConnection drops the connection without an answer: SQS unreachable.
func cutConnection(w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err == nil {
		_ = conn.Close()
	}
}

// TestDeleteCallErrorsMapped: a DeleteMessageBatch call that fails is
// mapped as a Publish's is: sdk.ErrUnavailable when SQS cannot be reached
// (SyncAck Ack, DeadLetter, Flush), sdk.ErrNotFound for a missing queue,
// sdk.ErrClosed when it fails while Close sends the buffered deletes.
func TestDeleteCallErrorsMapped(t *testing.T) {
	ctx := testCtx(t)
	t.Run("unreachable", func(t *testing.T) {
		b, err := sqs.New(deleteFailServer(t, cutConnection), sqs.Options{WaitTime: time.Second, SyncAck: true})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		ds, err := b.Receive(ctx, "q", 2)
		if err != nil || len(ds) != 2 {
			t.Fatalf("Receive = %d deliveries, %v", len(ds), err)
		}
		var ae *sqs.AckError
		if err := ds[0].Ack(ctx); !errors.Is(err, sdk.ErrUnavailable) || !errors.As(err, &ae) {
			t.Errorf("SyncAck Ack with SQS unreachable: %v, want an AckError wrapping ErrUnavailable", err)
		}
		if err := ds[1].DeadLetter(ctx, errors.New("bad")); !errors.Is(err, sdk.ErrUnavailable) {
			t.Errorf("DeadLetter whose delete could not reach SQS: %v, want ErrUnavailable", err)
		}
	})
	t.Run("flush", func(t *testing.T) {
		b, err := sqs.New(deleteFailServer(t, cutConnection), sqs.Options{WaitTime: time.Second, AckInterval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		ds, err := b.Receive(ctx, "q", 1)
		if err != nil || len(ds) == 0 {
			t.Fatalf("Receive: %v", err)
		}
		if err := ds[0].Ack(ctx); err != nil {
			t.Fatal(err)
		}
		if err := b.Flush(ctx); !errors.Is(err, sdk.ErrUnavailable) {
			t.Errorf("Flush with SQS unreachable: %v, want ErrUnavailable", err)
		}
	})
	t.Run("missing queue", func(t *testing.T) {
		b, err := sqs.New(deleteFailServer(t, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/x-amz-json-1.0")
			w.Header().Set("x-amzn-query-error", "AWS.SimpleQueueService.NonExistentQueue;Sender")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"__type":"com.amazonaws.sqs#QueueDoesNotExist","message":"The specified queue does not exist."}`)
		}), sqs.Options{WaitTime: time.Second, SyncAck: true})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		ds, err := b.Receive(ctx, "q", 1)
		if err != nil || len(ds) == 0 {
			t.Fatalf("Receive: %v", err)
		}
		if err := ds[0].Ack(ctx); !errors.Is(err, sdk.ErrNotFound) {
			t.Errorf("SyncAck Ack on a deleted queue: %v, want ErrNotFound", err)
		}
	})
	t.Run("close", func(t *testing.T) {
		b, err := sqs.New(deleteFailServer(t, cutConnection), sqs.Options{WaitTime: time.Second, AckInterval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		ds, err := b.Receive(ctx, "q", 1)
		if err != nil || len(ds) == 0 {
			t.Fatalf("Receive: %v", err)
		}
		if err := ds[0].Ack(ctx); err != nil {
			t.Fatal(err)
		}
		if err := b.Close(); !errors.Is(err, sdk.ErrClosed) {
			t.Errorf("Close whose buffered delete failed: %v, want ErrClosed", err)
		}
	})
}

// TestExtendLeaseNonPositiveKeepsMessage: ExtendLease with zero or a
// negative duration extends by the broker's lease (as on the memory broker)
// and never hands the message back while its holder runs it; Retry with a
// negative delay still makes it visible at once. A lost ReceiveMessage
// answer would count one receive more: cleanRun.
func TestExtendLeaseNonPositiveKeepsMessage(t *testing.T) {
	cleanRun(t, func(logger *slog.Logger, lost func() bool) bool {
		return extendNonPositiveScenario(t, logger, lost)
	})
}

func extendNonPositiveScenario(t *testing.T, logger *slog.Logger, lost func() bool) bool {
	ctx := testCtx(t)
	b := newBroker(t, sqs.Options{VisibilityTimeout: 30 * time.Second, WaitTime: time.Second, Logger: logger})
	q := declare(t, b, "extnonpos", false, sqs.QueueConfig{})
	if err := b.Publish(ctx, q, &sdk.Message{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	d := receiveN(t, b, q, 1)[0]
	for _, dur := range []time.Duration{-time.Second, 0} {
		if err := d.ExtendLease(ctx, dur); err != nil {
			t.Fatalf("ExtendLease(%s) = %v", dur, err)
		}
	}
	// Whole long polls (WaitTime 1 s), none cut short: the emulator would
	// hand the message to a poll the client gave up on.
	for range 2 {
		ds, err := b.Receive(ctx, q, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, other := range ds {
			t.Fatalf("ExtendLease(<= 0) released the held message: another Receive got it (attempt %d) while its holder runs it", other.Attempt())
		}
	}
	if err := d.Retry(ctx, -time.Second, errors.New("again")); err != nil {
		t.Fatalf("Retry(-1s) = %v", err)
	}
	again := receiveCounted(t, b, q, lost)
	if again == nil {
		return false
	}
	if again.Attempt() != 2 {
		t.Errorf("after Retry(-1s): attempt %d, want 2", again.Attempt())
	}
	return true
}
