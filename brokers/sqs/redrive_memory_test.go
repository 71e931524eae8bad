package sqs_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go/middleware"

	"github.com/berthq/berth/brokers/sqs"
)

// TestRedriveAllRemembersBoundedIDs: a redrive of all kept the berth ID of
// every letter it redrove, so its memory grew with the dead-letter queue,
// past the bound its scan keeps on held letters. Now it remembers at most
// that many, and still redrives every letter once. (Not parallel: the hook
// is the package's.)
func TestRedriveAllRemembersBoundedIDs(t *testing.T) {
	b := newBroker(t, fastOptions())
	q := declare(t, b, "redrivemem", false, sqs.QueueConfig{})
	sqs.SetScanLimits(b, 30*time.Second, 10)
	msgs := fillDeadLetters(t, b, q, 25)
	var remembered atomic.Int64
	remembered.Store(-1)
	sqs.OnRedriveEnd(func(n int) { remembered.Store(int64(n)) })
	t.Cleanup(func() { sqs.OnRedriveEnd(nil) })

	n, err := b.RedriveDeadLetters(testCtx(t), q)
	if n != len(msgs) || err != nil {
		t.Fatalf("RedriveDeadLetters(all) = %d, %v; want %d, nil", n, err, len(msgs))
	}
	if r := remembered.Load(); r < 0 || r > 10 {
		t.Errorf("the redrive remembered %d IDs at its end; want at most 10 (the scan's bound)", r)
	}
	raw := newClient(t)
	if got := drainRaw(t, raw, queueURL(t, raw, q)); got != len(msgs) {
		t.Errorf("%d messages redriven to %s, want %d", got, q, len(msgs))
	}
}

// TestRedriveAllPastItsMemoryLeavesLettersThatCameBack: a redrive of all
// that has redriven more letters than it remembers must still not redrive
// one that comes back (a consumer dead-lettered it again while the call
// ran), or the call might never end: a dead letter sent to the dead-letter
// queue after the call began stays, reported by a *ScanError.
func TestRedriveAllPastItsMemoryLeavesLettersThatCameBack(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var redriven int          // entries sent to the queue (not its dead-letter queue)
	var comeBack func() error // dead-letters copies of the first letters again
	var q string
	watch := func(st *middleware.Stack) error {
		return st.Initialize.Add(middleware.InitializeMiddlewareFunc("berthTestComeBack",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				mu.Lock()
				switch p := in.Parameters.(type) {
				case *awssqs.SendMessageBatchInput:
					if q != "" && strings.HasSuffix(aws.ToString(p.QueueUrl), "/"+q) {
						redriven += len(p.Entries)
					}
				case *awssqs.DeleteMessageBatchInput:
					if comeBack != nil && redriven > 10 { // past what the call remembers
						f := comeBack
						comeBack = nil
						mu.Unlock()
						if err := f(); err != nil {
							return middleware.InitializeOutput{}, middleware.Metadata{}, err
						}
						return next.HandleInitialize(ctx, in)
					}
				}
				mu.Unlock()
				return next.HandleInitialize(ctx, in)
			}), middleware.Before)
	}
	b := newBroker(t, fastOptions(), watch)
	other := newBroker(t, fastOptions())
	name := declare(t, b, "redrivecameback", false, sqs.QueueConfig{})
	sqs.SetScanLimits(b, 30*time.Second, 10)
	msgs := fillDeadLetters(t, b, name, 25)
	ctx := testCtx(t)
	back := []string{msgs[0].ID, msgs[1].ID, msgs[2].ID}
	mu.Lock()
	q = name
	comeBack = func() error {
		return other.Publish(ctx, name+"-dlq", msgs[0].Clone(), msgs[1].Clone(), msgs[2].Clone())
	}
	mu.Unlock()

	n, err := b.RedriveDeadLetters(ctx, name)
	mu.Lock()
	injected := comeBack == nil
	mu.Unlock()
	if !injected {
		t.Fatal("no letter came back during the redrive")
	}
	var se *sqs.ScanError
	if n != len(msgs) || !errors.As(err, &se) || se.Remaining != len(back) {
		t.Fatalf("RedriveDeadLetters(all) = %d, %v; want %d and a *ScanError with %d remaining", n, err, len(msgs), len(back))
	}
	left, err := b.ListDeadLetters(ctx, name, 10)
	var ids []string
	for _, m := range left {
		ids = append(ids, m.ID)
	}
	slices.Sort(ids)
	slices.Sort(back)
	if err != nil || !slices.Equal(ids, back) {
		t.Fatalf("dead letters left %v, %v; want the copies that came back %v", ids, err, back)
	}
	raw := newClient(t)
	if got := drainRaw(t, raw, queueURL(t, raw, name)); got != len(msgs) {
		t.Errorf("%d messages redriven to %s, want %d", got, name, len(msgs))
	}
}
