package sqs_test

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/internal/syncbuf"
	"github.com/berthq/berth/sdk"
)

// A queue (and its dead-letter queue) whose MaximumMessageSize is below
// Options.MaxWireSize — made outside berth with SQS's historical default of
// 256 KiB, or by a broker with a smaller MaxWireSize, used with berth's
// default 1 MiB. DeadLetter fitted its copy to MaxWireSize only, so SQS
// refused the copy of a message that fit the queue, and the message came
// back until SQS's redrive policy moved it without berth's reason. The copy
// is now fitted to the dead-letter queue's own limit.
func TestDeadLetterFitsTheQueuesOwnLimit(t *testing.T) {
	small := sqs.Options{VisibilityTimeout: 1e9, WaitTime: 1e9, MaxWireSize: 4096, MaxMessageSize: 4096}
	owner := newBroker(t, small)
	q := declare(t, owner, "qlimit", false, sqs.QueueConfig{}) // MaximumMessageSize 4096 on both
	b := newBroker(t, fastOptions())                           // MaxWireSize default 1 MiB
	ctx := testCtx(t)
	m := &sdk.Message{ID: sdk.NewID(), Type: "t", Body: bytes.Repeat([]byte("x"), 3900)}
	if err := b.Publish(ctx, q, m); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	t.Logf("wire size %d", sqs.WireSize(m))
	d := receiveN(t, b, q, 1)[0]
	err := d.DeadLetter(ctx, sdk.Permanent(errors.New("boom")))
	if err != nil {
		t.Fatalf("DeadLetter of a message Publish accepted: %v", err)
	}
	got, err := b.GetDeadLetter(ctx, q, m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Body, m.Body) || got.Header(sqs.HeaderDeadLetterTruncated) == "" {
		t.Errorf("dead letter: body kept %v, marker %q; want the body whole and the copy marked", bytes.Equal(got.Body, m.Body), got.Header(sqs.HeaderDeadLetterTruncated))
	}
}

// approxMessages is q's ApproximateNumberOfMessages, read with a raw client
// (no receive, so no answer the emulator may lose).
func approxMessages(t *testing.T, c *awssqs.Client, url string) int {
	t.Helper()
	out, err := c.GetQueueAttributes(testCtx(t), &awssqs.GetQueueAttributesInput{
		QueueUrl:       aws.String(url),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages},
	})
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(out.Attributes[string(sqstypes.QueueAttributeNameApproximateNumberOfMessages)])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// sized returns a message whose encoded size is exactly wire bytes.
func sized(t *testing.T, wire int) *sdk.Message {
	t.Helper()
	m := &sdk.Message{ID: sdk.NewID(), Type: "sized", CorrelationID: "corr", Body: []byte("y")}
	m.Body = bytes.Repeat([]byte("y"), 1+wire-sqs.WireSize(m))
	if n := sqs.WireSize(m); n != wire {
		t.Fatalf("test message of %d bytes on the wire, want %d", n, wire)
	}
	return m
}

// A queue made outside berth (Terraform, the console) with a
// MaximumMessageSize below Options.MaxWireSize: Publish checked only
// MaxWireSize, so a message between the two limits went to SQS, which
// refused it entry by entry — a PublishError holding SQS's raw
// InvalidParameterValue, the rest of the batch published. Publish now reads
// the queue's limit (once, cached) and refuses such a message with a typed
// MessageTooLargeError whose Limit is that limit less the copy reserve,
// before anything of the batch is sent.
func TestPublishChecksTheQueuesOwnLimit(t *testing.T) {
	const queueLimit = 64 << 10
	ctx := testCtx(t)
	raw := newClient(t)
	name := "ownlimit_" + suffix()
	out, err := raw.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(name),
		Attributes: map[string]string{string(sqstypes.QueueAttributeNameMaximumMessageSize): strconv.Itoa(queueLimit)}})
	if err != nil {
		t.Fatal(err)
	}
	url := aws.ToString(out.QueueUrl)
	t.Cleanup(func() { deleteQueue(t, name) })
	c := newCalls()
	b := newBroker(t, fastOptions(), c.option) // MaxWireSize 1 MiB
	limit := queueLimit - sqs.CopyReserve

	small1 := &sdk.Message{Type: "small", Body: []byte("a")}
	big := &sdk.Message{Type: "big", Body: bytes.Repeat([]byte("x"), 100<<10)}
	small2 := &sdk.Message{Type: "small", Body: []byte("b")}
	err = b.Publish(ctx, name, small1, big, small2)
	var tooLarge *sdk.MessageTooLargeError
	if !errors.As(err, &tooLarge) || !errors.Is(err, sdk.ErrMessageTooLarge) {
		t.Fatalf("Publish of a message over the queue's MaximumMessageSize: %v, want *sdk.MessageTooLargeError", err)
	}
	if tooLarge.ID != big.ID || tooLarge.Size != sqs.WireSize(big) || tooLarge.Limit != limit {
		t.Errorf("MessageTooLargeError %+v, want ID %s, Size %d, Limit %d", *tooLarge, big.ID, sqs.WireSize(big), limit)
	}
	if n := c.get("SendMessageBatch"); n != 0 {
		t.Errorf("%d SendMessageBatch calls for a batch with a message too large, want none", n)
	}
	if n := approxMessages(t, raw, url); n != 0 {
		t.Errorf("%d messages in the queue after a refused batch, want 0", n)
	}

	// At the limit exactly: accepted; one byte over: refused, typed.
	if err := b.Publish(ctx, name, sized(t, limit)); err != nil {
		t.Fatalf("Publish of a message at the queue's limit less the reserve: %v", err)
	}
	over := sized(t, limit+1)
	if err := b.Publish(ctx, name, over); !errors.As(err, &tooLarge) || tooLarge.ID != over.ID || tooLarge.Limit != limit {
		t.Fatalf("Publish one byte over: %v, want a MessageTooLargeError for %s with Limit %d", err, over.ID, limit)
	}
	if n := approxMessages(t, raw, url); n != 1 {
		t.Errorf("%d messages in the queue, want the one at the limit", n)
	}
	// The limit is read once, not per Publish.
	if n := c.get("GetQueueAttributes"); n != 1 {
		t.Errorf("%d GetQueueAttributes calls for three Publish calls, want 1 (cached)", n)
	}
}

// A queue whose MaximumMessageSize is lowered after the broker read it: SQS
// refuses the entry over the new limit (a PublishError naming it, the others
// published), and that refusal makes the broker read the limit again, so
// that the next Publish refuses such a message itself, typed.
func TestPublishRereadsALoweredQueueLimit(t *testing.T) {
	ctx := testCtx(t)
	raw := newClient(t)
	b := newBroker(t, fastOptions())
	q := declare(t, b, "lowered", false, sqs.QueueConfig{}) // MaximumMessageSize 1 MiB
	url := queueURL(t, raw, q)
	if err := b.Publish(ctx, q, &sdk.Message{Type: "warm", Body: bytes.Repeat([]byte("w"), 2000)}); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.SetQueueAttributes(ctx, &awssqs.SetQueueAttributesInput{QueueUrl: aws.String(url),
		Attributes: map[string]string{string(sqstypes.QueueAttributeNameMaximumMessageSize): "1024"}}); err != nil {
		t.Fatal(err)
	}
	ok := &sdk.Message{Type: "ok", Body: []byte("fits")}
	big := &sdk.Message{Type: "big", Body: bytes.Repeat([]byte("x"), 2000)}
	err := b.Publish(ctx, q, ok, big)
	var pe *sdk.PublishError
	if !errors.As(err, &pe) || len(pe.Failed) != 1 || pe.Failed[big.ID] == nil {
		t.Fatalf("Publish after the limit was lowered: %v, want a PublishError naming only %s", err, big.ID)
	}
	big2 := &sdk.Message{Type: "big", Body: bytes.Repeat([]byte("x"), 2000)}
	var tooLarge *sdk.MessageTooLargeError
	if err := b.Publish(ctx, q, big2); !errors.As(err, &tooLarge) || tooLarge.ID != big2.ID || tooLarge.Limit != 1024-sqs.CopyReserve {
		t.Fatalf("Publish after SQS refused an entry: %v, want a MessageTooLargeError with Limit %d", err, 1024-sqs.CopyReserve)
	}
	if n := approxMessages(t, raw, url); n != 2 {
		t.Errorf("%d messages in the queue, want 2 (the warm-up and %s)", n, ok.ID)
	}
}

// A client whose IAM policy does not allow sqs:GetQueueAttributes (a
// producer given only sqs:SendMessage): Publish does not fail for want of
// the queue's limit; it checks MaxWireSize only, as before, and does not
// ask again on every Publish.
func TestPublishWithoutQueueAttributes(t *testing.T) {
	var mu sync.Mutex
	calls := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		op := strings.TrimPrefix(r.Header.Get("X-Amz-Target"), "AmazonSQS.")
		_, _ = io.ReadAll(r.Body)
		mu.Lock()
		calls[op]++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		switch op {
		case "GetQueueAttributes":
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"__type":"com.amazonaws.sqs#AccessDenied","message":"not authorized to perform sqs:GetQueueAttributes"}`)
		case "SendMessageBatch":
			_, _ = io.WriteString(w, `{"Successful":[{"Id":"0","MessageId":"x","MD5OfMessageBody":"x"}],"Failed":[]}`)
		default:
			s, _ := fakeCommon(op)
			_, _ = io.WriteString(w, s)
		}
	}))
	client := fakeClient(t, srv)
	var logs syncbuf.Buffer
	b, err := sqs.New(client, sqs.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for range 3 {
		if err := b.Publish(testCtx(t), "q", &sdk.Message{Type: "t", Body: []byte("a")}); err != nil {
			t.Fatalf("Publish without sqs:GetQueueAttributes: %v", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if calls["SendMessageBatch"] != 3 || calls["GetQueueAttributes"] != 1 {
		t.Errorf("calls %v, want 3 SendMessageBatch and 1 GetQueueAttributes (its refusal cached)", calls)
	}
	if !strings.Contains(logs.String(), "MaximumMessageSize") {
		t.Errorf("no warning about the unread limit; logs: %s", logs.String())
	}
}
