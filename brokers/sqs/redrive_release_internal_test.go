package sqs

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go/middleware"

	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// TestRedriveFailedSendDropsTheLettersMessages: a redrive whose
// SendMessageBatch call fails (SQS refuses the call: an IAM policy without
// sqs:SendMessage on the queue, the queue gone) keeps holding the page's
// letters, as it should, but kept their whole messages too, which only the
// send needed: a redrive of all goes on paging while its sends fail, so it
// held up to 10,000 letters of up to 1 MiB each. Now a failed send drops
// them, as a refused entry's does.
func TestRedriveFailedSendDropsTheLettersMessages(t *testing.T) {
	refused := errors.New("test: SendMessageBatch refused")
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := awssqs.New(awssqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(integration.SQSEndpoint(t)),
		Credentials:  credentials.NewStaticCredentialsProvider("berth", "berth", ""),
		HTTPClient:   &http.Client{Transport: tr},
		APIOptions: []func(*middleware.Stack) error{func(st *middleware.Stack) error {
			return st.Initialize.Add(middleware.InitializeMiddlewareFunc("berthTestRefuseSend",
				func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
					if p, ok := in.Parameters.(*awssqs.SendMessageBatchInput); ok && !strings.HasSuffix(aws.ToString(p.QueueUrl), "-dlq") {
						return middleware.InitializeOutput{}, middleware.Metadata{}, refused
					}
					return next.HandleInitialize(ctx, in)
				}), middleware.Before)
		}},
	})
	b, err := New(client, Options{VisibilityTimeout: time.Second, WaitTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := "redriverelease_" + strings.ReplaceAll(sdk.NewID(), "-", "")[:12]
	if err := b.EnsureQueue(ctx, name, QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = b.Close()
		c, err := New(client, Options{})
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		if err := c.DeleteQueue(context.Background(), name, true); err != nil {
			t.Error(err)
		}
	})
	msgs := []*sdk.Message{{Body: []byte(strings.Repeat("x", 64<<10))}, {Body: []byte(strings.Repeat("y", 64<<10))}}
	if err := b.Publish(ctx, name+"-dlq", msgs...); err != nil {
		t.Fatal(err)
	}
	seen := 0
	err = b.withScan(ctx, name, func(ctx context.Context, s *scan) error {
		for seen < len(msgs) {
			ls, err := s.next(ctx)
			if err != nil || len(ls) == 0 {
				return err
			}
			seen += len(ls)
			if _, err := b.redrive(ctx, s, ls, newRecentIDs(10)); !errors.Is(err, refused) {
				t.Errorf("redrive: %v, want the refused call's error", err)
			}
		}
		for _, l := range s.held {
			if l.msg != nil {
				t.Errorf("held letter %s keeps its message (%d bytes) after its redrive failed", l.sqsID, len(l.msg.Body))
			}
		}
		return nil
	})
	if err != nil || seen != len(msgs) {
		t.Fatalf("scan: %d letters seen, %v; want %d, nil", seen, err, len(msgs))
	}
}
