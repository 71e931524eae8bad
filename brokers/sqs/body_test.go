package sqs_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/berthq/berth/brokers/sqs"
)

// answerFirst is an HTTP client that plays the race SafeRequestBody
// avoids, which a real server produces now and then (on the emulator, one
// round of 5000 messages in four or so): net/http has written the request's
// body, the answer's headers arrive and smithy-go closes the body, and only
// then does net/http read the body once more, with io.Copy, to check that
// it ended. Its error (checkErr) is what made net/http close the connection
// under the answer.
type answerFirst struct {
	mu       sync.Mutex
	checks   int
	checkErr []error
}

func (a *answerFirst) Do(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.CopyN(io.Discard, r.Body, r.ContentLength) // the write
		_ = r.Body.Close()                                   // the answer came: smithy-go closes the body
		_, err := io.Copy(io.Discard, r.Body)                // net/http's last check
		a.mu.Lock()
		a.checks++
		a.checkErr = append(a.checkErr, err)
		a.mu.Unlock()
	}
	answer := `{}`
	switch r.Header.Get("X-Amz-Target") {
	case "AmazonSQS.GetQueueUrl":
		answer = `{"QueueUrl":"http://127.0.0.1:1/000000000000/q"}`
	case "AmazonSQS.ReceiveMessage":
		answer = `{"Messages":[]}`
	}
	return &http.Response{
		StatusCode: 200, ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"application/x-amz-json-1.0"}},
		Body:   io.NopCloser(strings.NewReader(answer)),
	}, nil
}

func (a *answerFirst) errs() []error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]error(nil), a.checkErr...)
}

// TestSafeRequestBody: with the option, net/http's last read of a body
// smithy-go already closed ends the body (no error); the Broker's receive
// calls carry it. Without it the same read fails (io.EOF from WriteTo), the
// failure that, on a real connection, closed it under a 200 answer and made
// the SDK retry a ReceiveMessage whose messages were then hidden for the
// visibility timeout.
func TestSafeRequestBody(t *testing.T) {
	do := &answerFirst{}
	client := awssqs.New(awssqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String("http://127.0.0.1:1"),
		Credentials:  credentials.NewStaticCredentialsProvider("berth", "berth", ""),
		HTTPClient:   do,
	})
	ctx := context.Background()
	in := &awssqs.ReceiveMessageInput{QueueUrl: aws.String("http://127.0.0.1:1/000000000000/q")}
	if _, err := client.ReceiveMessage(ctx, in, sqs.SafeRequestBody()); err != nil {
		t.Fatal(err)
	}
	if errs := do.errs(); len(errs) != 1 || errs[0] != nil {
		t.Fatalf("with SafeRequestBody, net/http's last read of the body: %v; want nil (the end of the body)", errs)
	}
	if _, err := client.ReceiveMessage(ctx, in); err != nil {
		t.Fatal(err)
	}
	if errs := do.errs(); len(errs) != 2 || errs[1] == nil {
		t.Logf("without SafeRequestBody the last read no longer fails (%v): smithy-go may have fixed the race; SafeRequestBody may no longer be needed", errs)
	}

	// The Broker's calls: a Receive (GetQueueUrl, then ReceiveMessage).
	b, err := sqs.New(client, sqs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	before := len(do.errs())
	if _, err := b.Receive(ctx, "q", 1); err != nil {
		t.Fatalf("receive: %v", err)
	}
	for _, err := range do.errs()[before:] {
		if err != nil {
			t.Errorf("a Broker call's body failed net/http's last read: %v", err)
		}
	}
	if len(do.errs()) == before {
		t.Fatal("the Broker made no call")
	}
}
