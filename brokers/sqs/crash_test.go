package sqs_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// Environment of the helper process.
const (
	helperRole  = "BERTH_SQS_HELPER"
	helperQueue = "BERTH_SQS_HELPER_QUEUE"
)

// helperProcess is the child of TestCrashedConsumer, run by TestMain instead
// of the tests when helperRole is set. It never returns: it fails with exit
// status 2, or waits for its SIGKILL.
func helperProcess() {
	fail := func(err error) {
		fmt.Println("ERROR", err)
		os.Exit(2)
	}
	client := awssqs.New(awssqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(os.Getenv("BERTH_SQS_ENDPOINT")),
		Credentials:  credentials.NewStaticCredentialsProvider("berth", "berth", ""),
	})
	// Deletes are buffered for an hour: only Flush sends them.
	b, err := sqs.New(client, sqs.Options{VisibilityTimeout: 2 * time.Second, WaitTime: time.Second, AckInterval: time.Hour})
	if err != nil {
		fail(err)
	}
	q := os.Getenv(helperQueue)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Each of the first 15 deliveries is acked as it comes, not once all 20
	// have: a ReceiveMessage answer the emulator loses hides its messages
	// for the visibility timeout, and deliveries held meanwhile would
	// outlive their 2 s leases (their Ack would fail).
	var flushed []string
	for received := 0; received < 20; {
		got, err := b.Receive(ctx, q, 20-received)
		if err != nil {
			fail(err)
		}
		for _, d := range got {
			received++
			if received > 15 { // never settled
				continue
			}
			if err := d.Ack(ctx); err != nil { // 11-15: acked, still in the buffer
				fail(err)
			}
			if received > 10 {
				continue
			}
			flushed = append(flushed, d.Message().ID)
			if received == 10 {
				if err := b.Flush(ctx); err != nil {
					fail(err)
				}
			}
		}
	}
	fmt.Printf("READY %s\n", strings.Join(flushed, ","))
	select {} // wait for SIGKILL
}

// TestCrashedConsumer: a consumer killed with acks still buffered and
// deliveries unsettled loses nothing. Every message whose delete was not
// flushed comes back after the visibility timeout; the flushed ones do not.
func TestCrashedConsumer(t *testing.T) {
	// A lease longer than the wait for the child's leases to run out.
	b := newBroker(t, sqs.Options{VisibilityTimeout: 10 * time.Second, WaitTime: time.Second})
	q := declare(t, b, "crash", false, sqs.QueueConfig{})
	ctx := testCtx(t)
	var msgs []*sdk.Message
	for i := range 30 {
		msgs = append(msgs, &sdk.Message{Type: "crash", Body: []byte(fmt.Sprint(i))})
	}
	if err := b.Publish(ctx, q, msgs...); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperRole+"=consumer", helperQueue+"="+q,
		"BERTH_SQS_ENDPOINT="+integration.SQSEndpoint(t))
	cmd.Stderr = os.Stderr
	// Killed below, or by the cleanup after a t.Fatal; not beyond this
	// process either.
	child, lines := integration.StartChildLines(t, cmd)
	var ready string
wait:
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the consumer exited before it was ready")
			}
			if strings.HasPrefix(l, "ERROR") {
				t.Fatalf("consumer: %s", l)
			}
			if rest, ok := strings.CutPrefix(l, "READY "); ok {
				ready = rest
				break wait
			}
		case <-ctx.Done():
			t.Fatal("the consumer never got ready")
		}
	}
	if err := child.Cmd.Process.Kill(); err != nil { // SIGKILL: no Close, no flush
		t.Fatal(err)
	}
	_ = child.Wait()

	flushed := map[string]bool{}
	for _, id := range strings.Split(ready, ",") {
		flushed[id] = true
	}
	if len(flushed) != 10 {
		t.Fatalf("the consumer reported %d flushed acks, want 10", len(flushed))
	}
	got := map[string]int{}
	// Acked as they come: held, the first could outlive their leases while
	// a lost ReceiveMessage answer hides the others (see receiveEach).
	receiveEach(t, b, q, 20, func(d sdk.Delivery) {
		got[d.Message().ID]++
		if flushed[d.Message().ID] {
			t.Errorf("message %s came back although its delete was flushed", d.Message().ID)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	})
	for _, m := range msgs {
		if !flushed[m.ID] && got[m.ID] != 1 {
			t.Errorf("message %s: received %d times after the crash, want 1", m.ID, got[m.ID])
		}
	}
	expectNone(t, b, q, 2500*time.Millisecond)
}
