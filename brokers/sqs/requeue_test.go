package sqs_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/internal/syncbuf"
	"github.com/berthq/berth/sdk"
)

// TestFlushSendsDeletesPutBackWhileItWaits: an Ack that completes a batch
// while every sender is busy puts its batch back in the buffer when its ctx
// ends. When that happens while a Flush or Close already waits for the
// deletes, the Flush sends it as soon as a sender is free. Before, the batch
// waited for the AckInterval timer, which Close had stopped (and which an
// AckInterval of an hour would not fire in time): the Flush, and Close, ran
// out their time, and Close dropped the deletes, whose messages came back
// and ran again.
func TestFlushSendsDeletesPutBackWhileItWaits(t *testing.T) {
	for _, how := range []string{"Flush", "Close"} {
		t.Run(how, func(t *testing.T) { putBackWhileFlushing(t, how) })
	}
}

func putBackWhileFlushing(t *testing.T, how string) {
	const senders = 4 // ackSenders
	fake := newHeldDeletes(t, senders)
	client, entered := fake.client, fake.entered
	b, err := sqs.New(client, sqs.Options{WaitTime: time.Second, AckInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		fake.release()
		_ = b.Close()
	}()
	ctx := testCtx(t)
	ds := receiveFake(ctx, t, b, (senders+1)*10)
	for _, d := range ds[:senders*10] { // a full batch for every sender
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range senders {
		<-entered
	}
	last := ds[senders*10:]
	for _, d := range last[:9] {
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The tenth completes a batch, which waits for a sender until its ctx
	// is cancelled.
	actx, cancelAck := context.WithCancel(ctx)
	acked := make(chan error, 1)
	go func() { acked <- last[9].Ack(actx) }()
	for sqs.AcksHeld(b) < len(ds) {
		if ctx.Err() != nil {
			t.Fatal("the last Ack never reached the buffer")
		}
		time.Sleep(time.Millisecond)
	}

	gen := sqs.AckGeneration(b)
	finished := make(chan error, 1)
	go func() {
		if how == "Close" {
			finished <- b.Close()
			return
		}
		fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		finished <- b.Flush(fctx)
	}()
	for sqs.AckGeneration(b) == gen {
		if ctx.Err() != nil {
			t.Fatal("the Flush never started")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // the Flush took the buffer and waits
	cancelAck()
	if err := <-acked; err != nil {
		t.Fatalf("Ack whose ctx ended while the senders were busy: %v, want nil (buffered)", err)
	}
	fake.release()
	if err := <-finished; err != nil {
		t.Errorf("%s: %v", how, err)
	}
	var missing []string
	for _, d := range ds {
		if !fake.wasDeleted(d) {
			missing = append(missing, d.Message().ID)
		}
	}
	if len(missing) > 0 {
		t.Errorf("%s returned without deleting %v, put back while it waited", how, missing)
	}
}

// TestFlushDoesNotWaitForLaterDeletes: a Flush waits for the deletes
// buffered or under way when it began, not for those added after it: a
// Worker draining on a broker that another Worker keeps acking on returns
// once its own deletes are sent. Before, Flush waited until the acker had
// nothing at all to send — never, under a steady stream of acks — and ran
// out its ctx (the draining Worker's Run failed after its SettleTimeout),
// while every ack added meanwhile went out alone, a call each.
func TestFlushDoesNotWaitForLaterDeletes(t *testing.T) {
	var receives sync.Mutex
	nextReceive := 0
	var mu sync.Mutex
	deleted := map[string]bool{}
	client := newFakeSQS(t, func(op string, n int, req map[string]any) string {
		switch op {
		case "ReceiveMessage": // 10 messages of distinct receipt handles a call
			receives.Lock()
			nextReceive++
			r := nextReceive
			receives.Unlock()
			return tenMessages(r)
		case "DeleteMessageBatch":
			time.Sleep(5 * time.Millisecond) // a round trip: deletes are always under way
			return answerDeletes(req, &mu, deleted)
		}
		if s, ok := fakeCommon(op); ok {
			return s
		}
		return `{}`
	})
	b, err := sqs.New(client, sqs.Options{WaitTime: time.Second, AckInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := testCtx(t)
	mine, err := b.Receive(ctx, "q", 10)
	if err != nil {
		t.Fatal(err)
	}
	// Other consumers of the broker ack without pause until the Flush
	// returns.
	stop := make(chan struct{})
	var others sync.WaitGroup
	for range 4 {
		others.Go(func() {
			for {
				ds, err := b.Receive(ctx, "q", 10)
				if err != nil {
					t.Error(err)
					return
				}
				for _, d := range ds {
					select {
					case <-stop:
						return
					default:
					}
					if err := d.Ack(ctx); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	defer others.Wait()
	defer close(stop)
	for sqs.AcksHeld(b) == 0 { // the others' deletes are under way
		if ctx.Err() != nil {
			t.Fatal("the other consumers never acked")
		}
		time.Sleep(time.Millisecond)
	}
	for _, d := range mine {
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := b.Flush(fctx); err != nil {
		t.Fatalf("Flush while other acks keep coming: %v, want nil once this one's deletes are sent", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, d := range mine {
		if h := "h" + strings.TrimPrefix(d.Message().ID, "m"); !deleted[h] {
			t.Errorf("Flush returned before the delete of %s was sent", h)
		}
	}
}

// heldDeletes is a fake SQS for the acker's tests: each ReceiveMessage
// answers ten messages (tenMessages), the first held DeleteMessageBatch
// calls each signal entered and wait for release, and every delete
// answers success, noted for wasDeleted.
type heldDeletes struct {
	client  *awssqs.Client
	entered chan struct{}
	release func() // lets the held calls answer; idempotent, also run at cleanup

	mu      sync.Mutex
	deleted map[string]bool // receipt handles
}

func newHeldDeletes(t *testing.T, held int) *heldDeletes {
	t.Helper()
	h := &heldDeletes{entered: make(chan struct{}, held), deleted: map[string]bool{}}
	gate := make(chan struct{})
	var once sync.Once
	h.release = func() { once.Do(func() { close(gate) }) }
	h.client = newFakeSQS(t, func(op string, n int, req map[string]any) string {
		switch op {
		case "ReceiveMessage":
			return tenMessages(n)
		case "DeleteMessageBatch":
			if n <= held {
				h.entered <- struct{}{}
				<-gate
			}
			return answerDeletes(req, &h.mu, h.deleted)
		}
		if s, ok := fakeCommon(op); ok {
			return s
		}
		return `{}`
	})
	t.Cleanup(h.release) // before the fake server's Close, which waits for held calls
	return h
}

// wasDeleted reports whether d's delete reached the fake.
func (h *heldDeletes) wasDeleted(d sdk.Delivery) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.deleted["h"+strings.TrimPrefix(d.Message().ID, "m")]
}

// tenMessages is a ReceiveMessage answer of ten messages of distinct
// receipt handles: m<r>-<i> held by h<r>-<i>.
func tenMessages(r int) string {
	var ms []string
	for i := range 10 {
		ms = append(ms, fmt.Sprintf(`{"MessageId":"m%d-%d","ReceiptHandle":"h%d-%d","Body":"x","Attributes":{"ApproximateReceiveCount":"1"}}`, r, i, r, i))
	}
	return `{"Messages":[` + strings.Join(ms, ",") + `]}`
}

// receiveFake receives n deliveries of queue "q" from b.
func receiveFake(ctx context.Context, t *testing.T, b *sqs.Broker, n int) []sdk.Delivery {
	t.Helper()
	var ds []sdk.Delivery
	for len(ds) < n {
		got, err := b.Receive(ctx, "q", 10)
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, got...)
	}
	return ds
}

// answerDeletes answers a DeleteMessageBatch request req with success for
// every entry, noting each receipt handle in deleted under mu.
func answerDeletes(req map[string]any, mu *sync.Mutex, deleted map[string]bool) string {
	var ok []string
	mu.Lock()
	defer mu.Unlock()
	for _, e := range req["Entries"].([]any) {
		e := e.(map[string]any)
		deleted[e["ReceiptHandle"].(string)] = true
		ok = append(ok, `{"Id":"`+e["Id"].(string)+`"}`)
	}
	return `{"Successful":[` + strings.Join(ok, ",") + `],"Failed":[]}`
}

// TestSyncAckDroppedAtCloseIsErrClosed: a SyncAck Ack whose delete is still
// waiting for a sender when Close gives up on it gets an error wrapping
// sdk.ErrClosed, as every other call cut off by Close does (the message was
// not deleted and runs again). Before, it got an AckError around a private
// "acker closed" error that errors.Is could not tell from a refusal.
func TestSyncAckDroppedAtCloseIsErrClosed(t *testing.T) {
	t.Parallel()
	const senders = 4 // ackSenders
	fake := newHeldDeletes(t, senders)
	client, entered := fake.client, fake.entered
	b, err := sqs.New(client, sqs.Options{WaitTime: time.Second, AckInterval: time.Hour, SyncAck: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	ds := receiveFake(ctx, t, b, (senders+1)*10)
	// SyncAck: every Ack waits for its delete, so each runs on its own
	// goroutine. The first 40 fill a batch for each sender, which the fake
	// server holds; the last 10 make a batch that waits for a sender.
	errs := make([]chan error, len(ds))
	ack := func(i int) {
		errs[i] = make(chan error, 1)
		go func() { errs[i] <- ds[i].Ack(ctx) }()
	}
	for i := range senders * 10 {
		ack(i)
	}
	for range senders {
		<-entered
	}
	for i := senders * 10; i < len(ds); i++ {
		ack(i)
	}
	for sqs.AcksHeld(b) < len(ds) {
		if ctx.Err() != nil {
			t.Fatal("the last Acks never reached the acker")
		}
		time.Sleep(time.Millisecond)
	}
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }() // gives up on the waiting batch after 10 s
	for i := senders * 10; i < len(ds); i++ {
		err := <-errs[i]
		var ae *sqs.AckError
		if !errors.Is(err, sdk.ErrClosed) || !errors.As(err, &ae) {
			t.Errorf("SyncAck Ack %d dropped at Close: %v, want an *sqs.AckError wrapping sdk.ErrClosed", i, err)
		}
	}
	fake.release() // the held deletes go through; Close returns once they have
	<-closed
	for i := range senders * 10 {
		if err := <-errs[i]; err != nil {
			t.Errorf("SyncAck Ack %d, deleted once its sender was free: %v", i, err)
		}
	}
	for _, d := range ds[senders*10:] {
		if fake.wasDeleted(d) {
			t.Errorf("%s deleted, though its Ack reported it dropped", d.Message().ID)
		}
	}
}

// TestSyncAckGivenUpStillReported: a SyncAck Ack whose ctx ends while its
// delete is in flight returns ctx's error; when SQS then refuses the
// delete, the message will be delivered again. That failure went nowhere:
// the buffered-ack path logs it and returns it from the next Flush, but a
// delete someone had waited for was only handed to that (gone) waiter. It
// is now logged and surfaced like a buffered one.
func TestSyncAckGivenUpStillReported(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	client := newFakeSQS(t, func(op string, n int, req map[string]any) string {
		if op == "DeleteMessageBatch" {
			entered <- struct{}{}
			<-release
			var failed []string
			for _, e := range req["Entries"].([]any) {
				id := e.(map[string]any)["Id"].(string)
				failed = append(failed, fmt.Sprintf(`{"Id":%q,"Code":"AccessDenied","Message":"not allowed","SenderFault":true}`, id))
			}
			return `{"Successful":[],"Failed":[` + strings.Join(failed, ",") + `]}`
		}
		if s, ok := fakeCommon(op); ok {
			return s
		}
		return `{}`
	})
	var logs syncbuf.Buffer
	opts := sqs.Options{WaitTime: time.Second, SyncAck: true, AckInterval: 5 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	b, ctx, ds := fakeReceive(t, client, opts, 1, 2)
	actx, cancel := context.WithCancel(ctx)
	acked := make(chan error, 1)
	go func() { acked <- ds[0].Ack(actx) }()
	<-entered
	cancel()
	if err := <-acked; !errors.Is(err, context.Canceled) {
		t.Fatalf("SyncAck Ack whose ctx ended while its delete was in flight: %v, want context.Canceled", err)
	}
	close(release)
	id := ds[0].Message().ID
	err := b.Flush(ctx)
	var ae *sqs.AckError
	if !errors.As(err, &ae) || ae.ID != id {
		t.Errorf("Flush after the given-up Ack's delete was refused: %v, want an *sqs.AckError for %s", err, id)
	}
	if !strings.Contains(logs.String(), "delete failed") || !strings.Contains(logs.String(), id) {
		t.Errorf("the refused delete of %s was not logged; log:\n%s", id, logs.String())
	}
}

// TestUnansweredDeleteIsUncertain: SQS answered a DeleteMessageBatch
// without naming an entry among the successful or the failed ones. What it
// did with that delete is unknown, as with a lost answer; the error said
// nothing of the kind. It now wraps sdk.ErrUnavailable, as the same answer
// to a Publish's entry does.
func TestUnansweredDeleteIsUncertain(t *testing.T) {
	t.Parallel()
	client := newFakeSQS(t, func(op string, _ int, _ map[string]any) string {
		if op == "DeleteMessageBatch" {
			return `{"Successful":[],"Failed":[]}`
		}
		if s, ok := fakeCommon(op); ok {
			return s
		}
		return `{}`
	})
	_, ctx, ds := fakeReceive(t, client, sqs.Options{WaitTime: time.Second, SyncAck: true}, 1, 2)
	err := ds[0].Ack(ctx)
	var ae *sqs.AckError
	if !errors.As(err, &ae) || !errors.Is(err, sdk.ErrUnavailable) {
		t.Errorf("SyncAck Ack of a delete SQS's answer left out: %v, want an *sqs.AckError wrapping sdk.ErrUnavailable", err)
	}
}
