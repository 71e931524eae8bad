package sqs_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// dlqDepth is how many messages q's dead-letter queue holds, visible or
// not, by a raw client: no scan that could miss a letter held elsewhere.
func dlqDepth(t *testing.T, ctx context.Context, q string) int {
	t.Helper()
	c := newClient(t)
	url, err := c.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(q + "-dlq")})
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: url.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{
		"ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible", "ApproximateNumberOfMessagesDelayed"}})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, v := range out.Attributes {
		k, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("attribute %q: %v", v, err)
		}
		n += k
	}
	return n
}

// TestDeadLetterAfterLeaseLostSendsNothing: a delivery whose lease ran out
// and whose message another consumer received since is not dead-lettered:
// DeadLetter returns ErrLeaseLost and sends no copy to the dead-letter
// queue (a letter there would duplicate the job that runs elsewhere).
func TestDeadLetterAfterLeaseLostSendsNothing(t *testing.T) {
	t.Parallel() // sleep-bound: waits out a lease
	first := newBroker(t, fastOptions())
	second := newBroker(t, sqs.Options{VisibilityTimeout: 30 * time.Second, WaitTime: time.Second})
	q := declare(t, first, "dllost", false, sqs.QueueConfig{})
	ctx := testCtx(t)
	m := &sdk.Message{Type: "t", Body: []byte("x")}
	if err := first.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	stale := receiveN(t, first, q, 1)[0]
	time.Sleep(1500 * time.Millisecond) // the 1 s lease runs out
	live := receiveN(t, second, q, 1)[0]
	if live.Message().ID != m.ID {
		t.Fatalf("received %s, want %s", live.Message().ID, m.ID)
	}
	if err := stale.DeadLetter(ctx, errors.New("bad")); !errors.Is(err, sdk.ErrLeaseLost) {
		t.Errorf("DeadLetter after the lease was lost: %v, want ErrLeaseLost", err)
	}
	_ = first.Flush(ctx)
	if n := dlqDepth(t, ctx, q); n != 0 {
		t.Errorf("dead-letter queue holds %d letters after a DeadLetter whose lease was lost, want 0", n)
	}
	if err := live.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := second.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestDeadLetterLeaseLostDuringSend: the lease runs out while the copy is
// being sent (a slow SendMessage) and another consumer receives the
// message meanwhile. The delete then fails with a stale receipt: the copy
// sent must not stay in the dead-letter queue (the job runs elsewhere),
// and DeadLetter returns ErrLeaseLost.
func TestDeadLetterLeaseLostDuringSend(t *testing.T) {
	t.Parallel() // sleep-bound: waits out a lease
	var q string
	second := newBroker(t, sqs.Options{VisibilityTimeout: 30 * time.Second, WaitTime: time.Second})
	var live sdk.Delivery
	slow := onOperation("SendMessageBatch", func(ctx context.Context) error {
		if live != nil {
			return nil
		}
		time.Sleep(1500 * time.Millisecond) // the 1 s lease runs out
		for live == nil {
			ds, err := second.Receive(ctx, q, 1)
			if err != nil {
				t.Errorf("second Receive: %v", err)
				return nil
			}
			if len(ds) > 0 {
				live = ds[0]
			}
		}
		return nil
	})
	first := newBroker(t, fastOptions(), slow)
	q = declare(t, second, "dlrace", false, sqs.QueueConfig{})
	ctx := testCtx(t)
	m := &sdk.Message{Type: "t", Body: []byte("x")}
	if err := second.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	d := receiveN(t, first, q, 1)[0]
	if err := d.DeadLetter(ctx, errors.New("bad")); !errors.Is(err, sdk.ErrLeaseLost) {
		t.Errorf("DeadLetter whose lease ran out during the send: %v, want ErrLeaseLost", err)
	}
	_ = first.Flush(ctx)
	if n := dlqDepth(t, ctx, q); n != 0 {
		t.Errorf("dead-letter queue holds %d letters after a DeadLetter whose lease was lost, want 0", n)
	}
	if live == nil {
		t.Fatal("the second consumer received nothing")
	}
	if err := live.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := second.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRedrivePolicyLetterFailureTimeStable: a message SQS's redrive policy
// moved to the dead-letter queue carries no failure time of berth's; the
// listing gives it one from what SQS says of the message, the same at
// every listing (not the listing's own time, which no age filter ever
// matches), within the time it was published and first listed.
func TestRedrivePolicyLetterFailureTimeStable(t *testing.T) {
	t.Parallel() // sleep-bound: waits out a lease
	b := newBroker(t, fastOptions())
	q := declare(t, b, "poisontime", false, sqs.QueueConfig{MaxReceiveCount: 1})
	ctx := testCtx(t)
	published := time.Now()
	m := &sdk.Message{Type: "poison", Body: []byte("x")}
	if err := b.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	receiveN(t, b, q, 1) // never settled: the lease runs out
	// fauxqs moves it on the receive that would exceed maxReceiveCount.
	for st := (sdk.QueueStats{}); st.DeadLettered != 1; {
		ds, err := b.Receive(ctx, q, 10)
		if err != nil {
			t.Fatalf("Receive: %v", err)
		}
		for _, d := range ds {
			t.Fatalf("delivered again (attempt %d) despite maxReceiveCount 1", d.Attempt())
		}
		if st, err = b.Stats(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	list := func() *sdk.Message {
		t.Helper()
		ls, err := b.ListDeadLetters(ctx, q, 10)
		if err != nil || len(ls) != 1 || ls[0].ID != m.ID {
			t.Fatalf("ListDeadLetters = %d letters, %v; want %s", len(ls), err, m.ID)
		}
		return ls[0]
	}
	firstListing := time.Now()
	one := list()
	time.Sleep(1100 * time.Millisecond)
	two := list()
	for _, h := range []string{sdk.HeaderFirstFailure, sdk.HeaderLastFailure} {
		if one.Header(h) != two.Header(h) {
			t.Errorf("%s %q at one listing, %q at the next: want one stable time", h, one.Header(h), two.Header(h))
		}
	}
	first, err1 := time.Parse(time.RFC3339Nano, one.Header(sdk.HeaderFirstFailure))
	last, err2 := time.Parse(time.RFC3339Nano, one.Header(sdk.HeaderLastFailure))
	if err1 != nil || err2 != nil {
		t.Fatalf("failure times %q, %q: %v, %v", one.Header(sdk.HeaderFirstFailure), one.Header(sdk.HeaderLastFailure), err1, err2)
	}
	const skew = time.Second // the emulator's clock against the test's, and its millisecond timestamps
	if first.After(last) || last.Before(published.Add(-skew)) || last.After(firstListing.Add(skew)) {
		t.Errorf("failure times %v, %v: want first <= last, within the publish (%v) and the first listing (%v)", first, last, published, firstListing)
	}
}
