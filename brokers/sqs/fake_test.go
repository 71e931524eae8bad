package sqs_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// fakeSQS answers the AWS JSON protocol with scripted batch results: the
// per-entry failures that a real server does not produce on demand. Every
// other path is tested against the emulator.
type fakeSQS struct {
	mu    sync.Mutex
	calls map[string]int
	// answer returns the JSON response to operation op, called n-th time
	// (from 1), with the request body.
	answer func(op string, n int, req map[string]any) string
}

// fakeClient is an SQS client of the test server srv, closed when the
// test ends: one attempt a call, and no checksum validation (fake answers
// carry made-up checksums).
func fakeClient(t *testing.T, srv *httptest.Server) *awssqs.Client {
	t.Cleanup(srv.Close)
	return awssqs.New(awssqs.Options{
		Region:                           "us-east-1",
		BaseEndpoint:                     aws.String(srv.URL),
		Credentials:                      credentials.NewStaticCredentialsProvider("berth", "berth", ""),
		HTTPClient:                       &http.Client{Transport: transport},
		DisableMessageChecksumValidation: true,
		RetryMaxAttempts:                 1,
	})
}

func newFakeSQS(t *testing.T, answer func(op string, n int, req map[string]any) string) *awssqs.Client {
	t.Helper()
	f := &fakeSQS{calls: map[string]int{}, answer: answer}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		op := strings.TrimPrefix(r.Header.Get("X-Amz-Target"), "AmazonSQS.")
		body, _ := io.ReadAll(r.Body)
		var req map[string]any
		_ = json.Unmarshal(body, &req)
		f.mu.Lock()
		f.calls[op]++
		n := f.calls[op]
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		_, _ = io.WriteString(w, f.answer(op, n, req))
	}))
	return fakeClient(t, srv)
}

// fakeCommon answers the calls every scenario makes.
func fakeCommon(op string) (string, bool) {
	switch op {
	case "GetQueueUrl":
		return `{"QueueUrl":"http://fake/000000000000/q"}`, true
	case "ReceiveMessage":
		return `{"Messages":[{"MessageId":"m0","ReceiptHandle":"h0","Body":"a","Attributes":{"ApproximateReceiveCount":"1"}},` +
			`{"MessageId":"m1","ReceiptHandle":"h1","Body":"b","Attributes":{"ApproximateReceiveCount":"1"}}]}`, true
	}
	return "", false
}

// TestDeleteEntryFailures: a delete entry that fails on SQS's side is sent
// again; one that fails by the sender's fault is reported by Flush.
func TestDeleteEntryFailures(t *testing.T) {
	var mu sync.Mutex
	var deletes [][]string // receipt handles per DeleteMessageBatch call
	client := newFakeSQS(t, func(op string, n int, req map[string]any) string {
		if s, ok := fakeCommon(op); ok {
			return s
		}
		if op != "DeleteMessageBatch" {
			return `{}`
		}
		var handles []string
		for _, e := range req["Entries"].([]any) {
			handles = append(handles, e.(map[string]any)["ReceiptHandle"].(string))
		}
		mu.Lock()
		deletes = append(deletes, handles)
		mu.Unlock()
		if n == 1 { // h0: server fault, retried; h1: sender fault, surfaced
			return `{"Successful":[],"Failed":[` +
				`{"Id":"0","Code":"InternalError","Message":"try again","SenderFault":false},` +
				`{"Id":"1","Code":"ReceiptHandleIsInvalid","Message":"bad handle","SenderFault":true}]}`
		}
		return `{"Successful":[{"Id":"0"}],"Failed":[]}`
	})
	b, ctx, ds := fakeReceive(t, client, sqs.Options{WaitTime: time.Second, AckInterval: time.Hour}, 10, 2)
	for _, d := range ds {
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	err := b.Flush(ctx)
	var ae *sqs.AckError
	var ee *sqs.EntryError
	if !errors.As(err, &ae) || ae.ID != "m1" || !errors.As(err, &ee) || ee.Code != "ReceiptHandleIsInvalid" {
		t.Fatalf("Flush: %v, want the AckError of m1 (ReceiptHandleIsInvalid) only", err)
	}
	if strings.Contains(err.Error(), "m0") {
		t.Errorf("Flush reported m0, whose delete succeeded on retry: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(deletes) != 2 || len(deletes[0]) != 2 || len(deletes[1]) != 1 || deletes[1][0] != "h0" {
		t.Errorf("DeleteMessageBatch calls %v, want [h0 h1] then [h0]", deletes)
	}
}

// TestPublishUnansweredEntry: an entry SQS reports in neither list is a
// failure, never assumed published.
func TestPublishUnansweredEntry(t *testing.T) {
	client := newFakeSQS(t, func(op string, n int, req map[string]any) string {
		if s, ok := fakeCommon(op); ok {
			return s
		}
		if op == "SendMessageBatch" { // answers entry 0, forgets entry 1
			return `{"Successful":[{"Id":"0","MessageId":"x","MD5OfMessageBody":"x"}],"Failed":[]}`
		}
		return `{}`
	})
	b, err := sqs.New(client, sqs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	m0, m1 := &sdk.Message{Body: []byte("a")}, &sdk.Message{Body: []byte("b")}
	err = b.Publish(testCtx(t), "q", m0, m1)
	var pe *sdk.PublishError
	if !errors.As(err, &pe) || len(pe.Failed) != 1 || pe.Failed[m1.ID] == nil {
		t.Fatalf("Publish: %v, want a PublishError naming %s only", err, m1.ID)
	}
}

// TestDeadLetterDeleteUnansweredEntry: a dead-letter delete that SQS reports
// in neither list (as TestPublishUnansweredEntry's send) is a failure, never
// silently dropped. PurgeDeadLetters returned nil with the letter still in
// the dead-letter queue (and a redrive would leave a redriven letter there
// too, to be redriven again); now the error says so.
func TestDeadLetterDeleteUnansweredEntry(t *testing.T) {
	var mu sync.Mutex
	var deletes []string
	client := newFakeSQS(t, func(op string, n int, req map[string]any) string {
		switch op {
		case "ReceiveMessage":
			if n > 1 { // the dead-letter queue is empty after the first page
				return `{"Messages":[]}`
			}
		case "DeleteMessageBatch": // answers entry 0, forgets entry 1
			mu.Lock()
			for _, e := range req["Entries"].([]any) {
				deletes = append(deletes, e.(map[string]any)["ReceiptHandle"].(string))
			}
			mu.Unlock()
			return `{"Successful":[{"Id":"0"}],"Failed":[]}`
		}
		if s, ok := fakeCommon(op); ok {
			return s
		}
		return `{}`
	})
	b, err := sqs.New(client, sqs.Options{WaitTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	n, err := b.PurgeDeadLetters(testCtx(t), "q")
	mu.Lock()
	defer mu.Unlock()
	if len(deletes) != 2 {
		t.Fatalf("DeleteMessageBatch entries %v, want h0 and h1", deletes)
	}
	if n != 1 || err == nil {
		t.Fatalf("PurgeDeadLetters = %d, %v; want 1 and an error for the unanswered delete", n, err)
	}
}

// fakeReceive makes a broker on client with opts (closed when the test
// ends) and receives up to max messages of queue "q", failing t unless it
// gets want deliveries.
func fakeReceive(t *testing.T, client *awssqs.Client, opts sqs.Options, max, want int) (*sqs.Broker, context.Context, []sdk.Delivery) {
	t.Helper()
	b, err := sqs.New(client, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	ctx := testCtx(t)
	ds, err := b.Receive(ctx, "q", max)
	if err != nil || len(ds) != want {
		t.Fatalf("Receive = %d deliveries, %v; want %d", len(ds), err, want)
	}
	return b, ctx, ds
}
