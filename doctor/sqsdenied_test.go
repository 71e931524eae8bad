package doctor_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/integration"
)

// TestSQSAttributesDenied: credentials whose IAM policy does not allow
// sqs:GetQueueAttributes on a queue (or on its dead-letter queue) made the
// whole doctor run fail on that queue, and the other queues went
// unchecked. The refusal is now an info finding, sqs.queue-attributes,
// naming the checks not made, and the rest of the run goes on. The
// emulator has no IAM: a proxy in front of it refuses those calls as SQS
// does and passes every other call through.
func TestSQSAttributesDenied(t *testing.T) {
	denied, withDLQDenied, plain := "denied", "dlqdenied", "plain"
	_, sb := openSQS(t, &denied, &withDLQDenied, &plain)
	ctx := testCtx(t)
	for _, q := range []string{denied, withDLQDenied, plain} {
		if err := sb.DeclareQueue(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	refuse := map[string]bool{denied: true, withDLQDenied + "-dlq": true}
	target, err := url.Parse(integration.SQSEndpoint(t))
	if err != nil {
		t.Fatal(err)
	}
	pass := httputil.NewSingleHostReverseProxy(target)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		var in struct{ QueueUrl string }
		_ = json.Unmarshal(body, &in)
		name := in.QueueUrl[strings.LastIndexByte(in.QueueUrl, '/')+1:]
		if r.Header.Get("X-Amz-Target") == "AmazonSQS.GetQueueAttributes" && refuse[name] {
			w.Header().Set("Content-Type", "application/x-amz-json-1.0")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"__type":"com.amazonaws.sqs#AccessDenied","message":"not authorized to perform sqs:GetQueueAttributes"}`)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		pass.ServeHTTP(w, r)
	}))
	defer proxy.Close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := awssqs.New(awssqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(proxy.URL),
		Credentials:  credentials.NewStaticCredentialsProvider("berth", "berth", ""),
		HTTPClient:   &http.Client{Transport: tr},
	})
	pb, err := sqs.New(client, sqs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pb.Close()

	fs, err := doctor.Run(ctx, pb, doctor.Options{Queues: []string{denied, withDLQDenied, plain}})
	if err != nil {
		t.Fatalf("doctor failed the run on a refused GetQueueAttributes: %v", err)
	}
	expect(t, fs, "sqs.queue-attributes", denied, doctor.Info)
	if got := find(fs, "sqs.redrive-policy", denied); len(got) != 0 {
		t.Errorf("sqs.redrive-policy on %s, whose attributes were refused: %+v", denied, got)
	}
	expect(t, fs, "sqs.queue-attributes", withDLQDenied, doctor.Info)
	expect(t, fs, "sqs.redrive-policy", withDLQDenied, doctor.OK)
	if got := find(fs, "sqs.dlq-retention", withDLQDenied); len(got) != 0 {
		t.Errorf("sqs.dlq-retention on %s, whose dead-letter queue's attributes were refused: %+v", withDLQDenied, got)
	}
	expect(t, fs, "sqs.redrive-policy", plain, doctor.OK)
	expect(t, fs, "sqs.dlq-retention", plain, doctor.OK)
	if got := find(fs, "sqs.queue-attributes", plain); len(got) != 0 {
		t.Errorf("sqs.queue-attributes on %s, whose attributes were read: %+v", plain, got)
	}
}
