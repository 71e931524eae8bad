package sqs_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/internal/syncbuf"
)

// forgedLogBound bounds a log record about a message with a 100 KiB ID:
// berth logs message fields cut to sdk.MaxLogTextLength and causes to
// sdk.MaxReasonLength (sdk.LogText, sdk.LogCause).
const forgedLogBound = 8 << 10

// sendForged sends body with a "berth" attribute value envelope, as a
// producer outside berth may, with a raw client.
func sendForged(t *testing.T, raw *awssqs.Client, url, envelope string) {
	t.Helper()
	_, err := raw.SendMessage(testCtx(t), &awssqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String("x"),
		MessageAttributes: map[string]sqstypes.MessageAttributeValue{"berth": {DataType: aws.String("String"), StringValue: aws.String(envelope)}}},
		sqs.SafeRequestBody())
	if err != nil {
		t.Fatal(err)
	}
}

// TestUndecodableMessageLogIsBounded: a message whose berth envelope does
// not decode (here an unknown body encoding) was logged with the decoding
// error, which quotes the envelope's ID and encoding whole: a producer's
// 100 KiB ID made a 100 KiB record at every receive of the message. The
// cause is now logged cut, as the Worker logs one (sdk.LogCause).
func TestUndecodableMessageLogIsBounded(t *testing.T) {
	var logs syncbuf.Buffer
	opts := fastOptions()
	opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	b := newBroker(t, opts)
	q := declare(t, b, "logbound", false, sqs.QueueConfig{})
	raw := newClient(t)
	id := strings.Repeat("i", 100<<10)
	sendForged(t, raw, queueURL(t, raw, q), `{"v":1,"id":"`+id+`","e":"bogus"}`)
	d := receiveN(t, b, q, 1)[0]
	if got := d.Message().ID; strings.Contains(got, "iiii") {
		t.Fatalf("the undecodable message was delivered with the forged ID (%d bytes), not as a foreign one", len(got))
	}
	if err := d.Ack(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if !strings.Contains(out, "undecodable message") {
		t.Fatalf("no warning logged for the undecodable message: %q", out)
	}
	if len(out) > forgedLogBound {
		t.Errorf("the warning about an undecodable message with a %d-byte ID is %d bytes long; want at most %d", len(id), len(out), forgedLogBound)
	}
}

// TestFailedDeleteLogIsBounded: a buffered delete that fails (here its
// lease ran out and another consumer received the message before the
// delete was sent) is logged with the message's berth ID, which comes
// from the message's producer: it was logged whole, twice (the ID, and
// the error quoting it). It is now cut as the Worker cuts it (sdk.LogText,
// sdk.LogCause).
func TestFailedDeleteLogIsBounded(t *testing.T) {
	var logs syncbuf.Buffer
	opts := sqs.Options{VisibilityTimeout: time.Second, WaitTime: time.Second, AckInterval: time.Hour}
	opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	b := newBroker(t, opts)
	q := declare(t, b, "logbounddel", false, sqs.QueueConfig{})
	raw := newClient(t)
	url := queueURL(t, raw, q)
	id := strings.Repeat("j", 100<<10)
	sendForged(t, raw, url, `{"v":1,"id":"`+id+`"}`)
	ctx := testCtx(t)
	d := receiveN(t, b, q, 1)[0]
	if d.Message().ID != id {
		t.Fatalf("delivered ID of %d bytes, want the forged one", len(d.Message().ID))
	}
	if err := d.Ack(ctx); err != nil { // buffered for an hour
		t.Fatal(err)
	}
	// Another consumer takes the message once its lease has run out.
	var took bool
	for !took {
		out, err := raw.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: aws.String(url), WaitTimeSeconds: 1, VisibilityTimeout: 30}, sqs.SafeRequestBody())
		if err != nil {
			t.Fatal(err)
		}
		took = len(out.Messages) == 1
	}
	if err := b.Flush(ctx); err == nil {
		t.Fatal("Flush: nil, want the delete's failure (its receipt is stale)")
	}
	out := logs.String()
	if !strings.Contains(out, "delete failed") {
		t.Fatalf("no warning logged for the failed delete: %q", out)
	}
	if len(out) > forgedLogBound {
		t.Errorf("the warning about the failed delete of a message with a %d-byte ID is %d bytes long; want at most %d", len(id), len(out), forgedLogBound)
	}
}
