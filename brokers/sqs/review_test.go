package sqs_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// TestRedriveKeepsUnsendableDeadLetter: a dead letter that cannot be sent
// back (here: larger than the redriving broker's MaxWireSize) stays in the
// dead-letter queue and is not counted as redriven; the others go back.
func TestRedriveKeepsUnsendableDeadLetter(t *testing.T) {
	big := newBroker(t, fastOptions())
	q := declare(t, big, "redrivekeep", false, sqs.QueueConfig{})
	ctx := testCtx(t)
	large := &sdk.Message{Type: "large", Body: []byte(strings.Repeat("x", 4000))}
	small := &sdk.Message{Type: "small", Body: []byte("ok")}
	if err := big.Publish(ctx, q, large, small); err != nil {
		t.Fatal(err)
	}
	receiveEach(t, big, q, 2, func(d sdk.Delivery) {
		if err := d.DeadLetter(ctx, errors.New("boom")); err != nil {
			t.Fatal(err)
		}
	})

	opts := fastOptions()
	opts.MaxWireSize, opts.MaxMessageSize = 2048, 2048
	tiny := newBroker(t, opts)
	n, err := tiny.RedriveDeadLetters(ctx, q)
	var tooLarge *sdk.MessageTooLargeError
	if !errors.As(err, &tooLarge) || tooLarge.ID != large.ID {
		t.Fatalf("RedriveDeadLetters error = %v, want a *sdk.MessageTooLargeError for %s", err, large.ID)
	}
	if n != 1 {
		t.Errorf("RedriveDeadLetters = %d, want 1 (the small message only)", n)
	}
	left, err := big.ListDeadLetters(ctx, q, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].ID != large.ID {
		ids := make([]string, len(left))
		for i, m := range left {
			ids[i] = m.ID
		}
		t.Fatalf("dead letters left = %v, want only the unsendable %s", ids, large.ID)
	}
	got := receiveN(t, big, q, 1)
	if got[0].Message().ID != small.ID {
		t.Fatalf("redriven %s, want %s", got[0].Message().ID, small.ID)
	}
}

// TestFlushTimeoutLeavesNoDeleteBehind: a Flush whose ctx ends while the
// sender is busy puts its deletes back in the buffer; they must still be sent
// by the AckInterval timer, not wait for the next Ack, Flush or Close (the
// message would meanwhile come back and run again).
func TestFlushTimeoutLeavesNoDeleteBehind(t *testing.T) {
	t.Parallel() // sleep-bound: waits out leases and delays
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	var mu sync.Mutex
	var deleted []string
	client := newFakeSQS(t, func(op string, n int, req map[string]any) string {
		if s, ok := fakeCommon(op); ok {
			return s
		}
		if op != "DeleteMessageBatch" {
			return `{}`
		}
		if n == 1 { // hold the sender with the first batch
			close(entered)
			<-release
		}
		var ok []string
		for _, e := range req["Entries"].([]any) {
			e := e.(map[string]any)
			mu.Lock()
			deleted = append(deleted, e["ReceiptHandle"].(string))
			mu.Unlock()
			ok = append(ok, `{"Id":"`+e["Id"].(string)+`"}`)
		}
		return `{"Successful":[` + strings.Join(ok, ",") + `],"Failed":[]}`
	})
	b, ctx, ds := fakeReceive(t, client, sqs.Options{WaitTime: time.Second, AckInterval: 200 * time.Millisecond}, 10, 2)
	flush := func(d time.Duration) error {
		fctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		return b.Flush(fctx)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := flush(100 * time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Flush with the sender held = %v, want context.DeadlineExceeded", err)
	}
	<-entered
	if err := ds[1].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	// Longer than the AckInterval: the timer fires (finding nothing) while
	// this Flush holds h1, which it then puts back.
	if err := flush(time.Second); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Flush with the sender held = %v, want context.DeadlineExceeded", err)
	}
	once.Do(func() { close(release) })
	for range 1000 { // up to 10 s: generous under load, over at once when sent
		mu.Lock()
		got := slices.Contains(deleted, "h1")
		mu.Unlock()
		if got {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Fatalf("deletes sent %v: h1 stayed buffered after its Flush timed out", deleted)
}

// TestCloseSendsTimerBatch: a batch the AckInterval timer took but could not
// yet hand to the (busy) sender when Close began is still deleted by Close.
func TestCloseSendsTimerBatch(t *testing.T) {
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	var mu sync.Mutex
	var deleted []string
	client := newFakeSQS(t, func(op string, n int, req map[string]any) string {
		if s, ok := fakeCommon(op); ok {
			return s
		}
		if op != "DeleteMessageBatch" {
			return `{}`
		}
		if n == 1 {
			close(entered)
			<-release
		}
		var ok []string
		for _, e := range req["Entries"].([]any) {
			e := e.(map[string]any)
			mu.Lock()
			deleted = append(deleted, e["ReceiptHandle"].(string))
			mu.Unlock()
			ok = append(ok, `{"Id":"`+e["Id"].(string)+`"}`)
		}
		return `{"Successful":[` + strings.Join(ok, ",") + `],"Failed":[]}`
	})
	b, err := sqs.New(client, sqs.Options{WaitTime: time.Second, AckInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	ds, err := b.Receive(ctx, "q", 10)
	if err != nil || len(ds) != 2 {
		t.Fatalf("Receive = %d deliveries, %v", len(ds), err)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	<-entered // the sender is busy with h0
	if err := ds[1].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the timer takes h1 and waits for the sender
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	time.Sleep(100 * time.Millisecond)
	once.Do(func() { close(release) })
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(deleted, "h1") {
		t.Fatalf("deletes sent %v: Close dropped h1, which the timer held", deleted)
	}
}

// TestDeadLetterKeepsOriginalWhenCopyFails: when the copy cannot be sent to
// the dead-letter queue (deleted behind the broker's back), DeadLetter fails
// and deletes nothing: the original comes back after its visibility timeout.
// A lost ReceiveMessage answer would count one receive more: cleanRun.
func TestDeadLetterKeepsOriginalWhenCopyFails(t *testing.T) {
	t.Parallel() // sleep-bound: waits out leases and delays
	cleanRun(t, func(logger *slog.Logger, lost func() bool) bool {
		return deadLetterCopyFailsScenario(t, logger, lost)
	})
}

func deadLetterCopyFailsScenario(t *testing.T, logger *slog.Logger, lost func() bool) bool {
	opts := fastOptions()
	opts.Logger = logger
	b := newBroker(t, opts)
	q := declare(t, b, "dlqgone", false, sqs.QueueConfig{})
	ctx := testCtx(t)
	first := &sdk.Message{Type: "first", Body: []byte("1")}
	second := &sdk.Message{Type: "second", Body: []byte("2")}
	if err := b.Publish(ctx, q, first); err != nil {
		t.Fatal(err)
	}
	// The first dead letter makes the broker resolve and cache the DLQ.
	if err := receiveN(t, b, q, 1)[0].DeadLetter(ctx, errors.New("boom")); err != nil {
		t.Fatal(err)
	}
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	client := newClient(t)
	url, err := client.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(q + "-dlq")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: url.QueueUrl}); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, q, second); err != nil {
		t.Fatal(err)
	}
	d := receiveN(t, b, q, 1)[0]
	if err := d.DeadLetter(ctx, errors.New("boom")); !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("DeadLetter to a deleted dead-letter queue: %v, want an error wrapping ErrNotFound", err)
	}
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	again := receiveCounted(t, b, q, lost)
	if again == nil {
		return false
	}
	if again.Message().ID != second.ID || again.Attempt() != 2 {
		t.Fatalf("got %s attempt %d, want %s back with attempt 2", again.Message().ID, again.Attempt(), second.ID)
	}
	if err := again.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	return true
}

// TestDelaysRoundUp: SQS counts delays and visibility in whole seconds; a
// delay between two of them is rounded up, so a retry or a delayed publish
// never comes early. (The conformance suite's delays are whole seconds.)
func TestDelaysRoundUp(t *testing.T) {
	t.Parallel() // sleep-bound: waits out leases and delays
	b := newBroker(t, fastOptions())
	q := declare(t, b, "roundup", false, sqs.QueueConfig{})
	ctx := testCtx(t)
	const delay = 1500 * time.Millisecond
	m := &sdk.Message{Type: "retried", Body: []byte("r")}
	if err := b.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	d := receiveN(t, b, q, 1)[0]
	retried := time.Now()
	if err := d.Retry(ctx, delay, errors.New("boom")); err != nil {
		t.Fatal(err)
	}
	back := receiveN(t, b, q, 1)[0]
	if el := time.Since(retried); el < delay {
		t.Errorf("retry delivered after %s, before its delay of %s", el, delay)
	}
	if err := back.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	published := time.Now()
	if err := b.Publish(ctx, q, &sdk.Message{Type: "delayed", Body: []byte("d"), Delay: delay}); err != nil {
		t.Fatal(err)
	}
	got := receiveN(t, b, q, 1)[0]
	if el := time.Since(published); el < delay {
		t.Errorf("delayed message delivered after %s, before its delay of %s", el, delay)
	}
	if err := got.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestDeleteBatchesStayWithinTen: deletes put back in the buffer (here by
// the timer when Close stops it) join those buffered meanwhile; however
// many they are, every DeleteMessageBatch call carries at most 10 entries,
// SQS's limit (more fail the whole call).
func TestDeleteBatchesStayWithinTen(t *testing.T) {
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	var mu sync.Mutex
	var sizes []int
	client := newFakeSQS(t, func(op string, n int, req map[string]any) string {
		if s, ok := fakeCommon(op); ok {
			return s
		}
		if op != "DeleteMessageBatch" {
			return `{}`
		}
		if n == 1 {
			close(entered)
			<-release
		}
		entries := req["Entries"].([]any)
		mu.Lock()
		sizes = append(sizes, len(entries))
		mu.Unlock()
		if len(entries) > 10 {
			return `{"__type":"com.amazonaws.sqs#TooManyEntriesInBatchRequest","message":"too many entries"}`
		}
		var ok []string
		for _, e := range entries {
			ok = append(ok, `{"Id":"`+e.(map[string]any)["Id"].(string)+`"}`)
		}
		return `{"Successful":[` + strings.Join(ok, ",") + `],"Failed":[]}`
	})
	b, err := sqs.New(client, sqs.Options{WaitTime: time.Second, AckInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	var ds []sdk.Delivery
	for len(ds) < 12 {
		got, err := b.Receive(ctx, "q", 10)
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, got...)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	<-entered // the sender is busy with the first delete
	for _, d := range ds[1:6] {
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond) // the timer takes those 5 and waits for the sender
	for _, d := range ds[6:] {
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	time.Sleep(100 * time.Millisecond)
	once.Do(func() { close(release) })
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	total := 0
	for _, n := range sizes {
		total += n
		if n > 10 {
			t.Errorf("DeleteMessageBatch calls of %v entries: one above SQS's limit of 10", sizes)
			break
		}
	}
	if total != len(ds) {
		t.Errorf("%d deletes sent in calls of %v entries, want %d", total, sizes, len(ds))
	}
}

// TestAckHonoursCtxWhenSenderBusy: an Ack that completes a batch of 10 while
// the sender is stuck on an earlier call (SQS slow) returns when its ctx
// ends, the delete still buffered, instead of blocking until SQS answers.
func TestAckHonoursCtxWhenSenderBusy(t *testing.T) {
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	var mu sync.Mutex
	deleted := 0
	client := newFakeSQS(t, func(op string, n int, req map[string]any) string {
		if s, ok := fakeCommon(op); ok {
			return s
		}
		if op != "DeleteMessageBatch" {
			return `{}`
		}
		if n == 1 {
			close(entered)
			<-release
		}
		var ok []string
		for _, e := range req["Entries"].([]any) {
			ok = append(ok, `{"Id":"`+e.(map[string]any)["Id"].(string)+`"}`)
		}
		mu.Lock()
		deleted += len(ok)
		mu.Unlock()
		return `{"Successful":[` + strings.Join(ok, ",") + `],"Failed":[]}`
	})
	b, err := sqs.New(client, sqs.Options{WaitTime: time.Second, AckInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	var ds []sdk.Delivery
	for len(ds) < 11 {
		got, err := b.Receive(ctx, "q", 10)
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, got...)
	}
	ds = ds[:11]
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	// Flush hands the first delete to the sender, which the fake holds; the
	// Flush is cancelled only once the sender has it. A Flush with a 50 ms
	// deadline could find it passed before it handed the delete over, and
	// put the delete back behind the hour-long AckInterval: no sender ever
	// entered, and the test hung.
	fctx, cancel := context.WithCancel(ctx)
	flushed := make(chan struct{})
	go func() { defer close(flushed); _ = b.Flush(fctx) }()
	<-entered
	cancel()
	<-flushed
	acked := make(chan error, 1)
	go func() {
		actx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		for _, d := range ds[1:] { // the tenth completes a batch
			if err := d.Ack(actx); err != nil {
				acked <- err
				return
			}
		}
		acked <- nil
	}()
	select {
	case err := <-acked:
		if err != nil {
			t.Errorf("Ack with the sender busy: %v, want nil (buffered)", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("Ack blocked past its ctx while the sender was busy")
		once.Do(func() { close(release) })
		<-acked
	}
	once.Do(func() { close(release) })
	if err := b.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if deleted != len(ds) {
		t.Errorf("%d deletes sent, want %d", deleted, len(ds))
	}
}
