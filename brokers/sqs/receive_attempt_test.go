package sqs_test

import (
	"encoding/json"
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
)

// TestFIFOReceiveSendsOneAttemptID: a FIFO receive whose answer was lost
// (the connection cut after SQS took the messages) was retried by the SDK
// without a ReceiveRequestAttemptId, so SQS could not hand the same batch
// back: the messages stayed hidden for the visibility timeout, blocking
// their message groups. Now every receive of a FIFO queue carries one,
// the same on the SDK's retries of the call and new for the next call; a
// standard queue's carries none. (The emulator ignores the parameter, so
// the wire is checked here, on a fake server whose first answer is lost.)
func TestFIFOReceiveSendsOneAttemptID(t *testing.T) {
	var mu sync.Mutex
	var ids []string // ReceiveRequestAttemptId per ReceiveMessage HTTP attempt ("" when none)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		op := strings.TrimPrefix(r.Header.Get("X-Amz-Target"), "AmazonSQS.")
		body, _ := io.ReadAll(r.Body)
		var req map[string]any
		_ = json.Unmarshal(body, &req)
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		switch op {
		case "GetQueueUrl":
			_, _ = io.WriteString(w, `{"QueueUrl":"http://fake/000000000000/`+req["QueueName"].(string)+`"}`)
			return
		case "ReceiveMessage":
		default:
			_, _ = io.WriteString(w, `{}`)
			return
		}
		id, _ := req["ReceiveRequestAttemptId"].(string)
		mu.Lock()
		ids = append(ids, id)
		first := len(ids) == 1
		mu.Unlock()
		if first { // the answer is lost: the connection closes under it
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		_, _ = io.WriteString(w, `{"Messages":[{"MessageId":"m0","ReceiptHandle":"h0","Body":"a","Attributes":{"ApproximateReceiveCount":"1"}}]}`)
	}))
	t.Cleanup(srv.Close)
	client := awssqs.New(awssqs.Options{
		Region:                           "us-east-1",
		BaseEndpoint:                     aws.String(srv.URL),
		Credentials:                      credentials.NewStaticCredentialsProvider("berth", "berth", ""),
		HTTPClient:                       &http.Client{Transport: transport},
		DisableMessageChecksumValidation: true,
		RetryMaxAttempts:                 3,
	})
	b, err := sqs.New(client, sqs.Options{WaitTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := testCtx(t)
	for _, q := range []string{"q.fifo", "q.fifo", "q"} {
		if ds, err := b.Receive(ctx, q, 10); err != nil || len(ds) != 1 {
			t.Fatalf("Receive(%s) = %d deliveries, %v; want 1", q, len(ds), err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	// The first call's two attempts (the lost one, the SDK's retry), the
	// second call's, the standard queue's.
	if len(ids) != 4 || ids[0] == "" || ids[1] != ids[0] || ids[2] == "" || ids[2] == ids[0] || ids[3] != "" {
		t.Fatalf("ReceiveRequestAttemptIds %q; want one for both attempts of the first call, another for the second, none on the standard queue", ids)
	}
}
