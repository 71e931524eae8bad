package sqs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// fastOptions gives short leases and polls for tests.
func fastOptions() sqs.Options {
	return sqs.Options{VisibilityTimeout: time.Second, WaitTime: time.Second}
}

// testTimeout bounds a test's waits (testCtx). The emulator now and then
// loses a ReceiveMessage answer after taking the messages: the SDK retries,
// and what the lost answer took stays hidden for the visibility timeout. A
// wait for a message must outlast the longest visibility timeout these
// tests receive with (30 s) plus the long polls after it.
const testTimeout = 60 * time.Second

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// receiveN receives until it holds n deliveries. It holds the first ones
// while the others come: one that a lost ReceiveMessage answer hides comes
// only after the visibility timeout, by when the leases of those held may
// have run out. Tests that settle what they receive use receiveEach.
func receiveN(t *testing.T, b *sqs.Broker, q string, n int) []sdk.Delivery {
	t.Helper()
	var out []sdk.Delivery
	receiveEach(t, b, q, n, func(d sdk.Delivery) { out = append(out, d) })
	return out
}

// receiveEach receives until n deliveries have come and calls each with
// every one as it comes, so that a delivery is settled within its lease
// however long the others take (a lost ReceiveMessage answer hides its
// messages for the visibility timeout).
func receiveEach(t *testing.T, b *sqs.Broker, q string, n int, each func(sdk.Delivery)) {
	t.Helper()
	ctx := testCtx(t)
	for got := 0; got < n; {
		ds, err := b.Receive(ctx, q, n-got)
		if err != nil {
			t.Fatalf("Receive: %v (after %d of %d deliveries)", err, got, n)
		}
		for _, d := range ds {
			each(d)
		}
		got += len(ds)
	}
}

// lostAnswers passes log records on to its Handler and counts the warnings
// a Broker's Receive logs when an attempt the SDK retried may have taken
// messages whose answer never arrived.
type lostAnswers struct {
	slog.Handler
	n *atomic.Int32
}

func (l lostAnswers) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "answer was lost") {
		l.n.Add(1)
	}
	return l.Handler.Handle(ctx, r)
}

func (l lostAnswers) WithAttrs(as []slog.Attr) slog.Handler {
	return lostAnswers{l.Handler.WithAttrs(as), l.n}
}

func (l lostAnswers) WithGroup(name string) slog.Handler {
	return lostAnswers{l.Handler.WithGroup(name), l.n}
}

// cleanRun runs a scenario that checks exact receive counts (Attempt(),
// Stats). A ReceiveMessage answer the emulator loses counts a receive of
// the messages it took and hides them for the visibility timeout, so the
// counts a run sees after one are off by what it took, which nobody can
// know. run gets the Logger for its brokers and lost, which reports whether
// one of their receives lost an answer so far; it checks lost before each
// count and returns false, asserting nothing more, when it reports true.
// The scenario then runs again from the start, on new queues: every count
// is checked exactly, on a run that lost no answer. Three runs that each
// lost one fail the test.
func cleanRun(t *testing.T, run func(logger *slog.Logger, lost func() bool) bool) {
	t.Helper()
	const tries = 3
	for try := 1; ; try++ {
		var n atomic.Int32
		logger := slog.New(lostAnswers{slog.Default().Handler(), &n})
		if run(logger, func() bool { return n.Load() > 0 }) {
			return
		}
		if try == tries {
			t.Fatalf("a ReceiveMessage answer was lost in each of %d runs: the receive counts could not be checked", tries)
		}
		t.Logf("run %d lost a ReceiveMessage answer; its receive counts say nothing: running again", try)
	}
}

// receiveCounted receives one delivery for a cleanRun scenario; it returns
// nil as soon as lost reports a lost answer (what it took may never come:
// SQS may move it to the dead-letter queue instead).
func receiveCounted(t *testing.T, b *sqs.Broker, q string, lost func() bool) sdk.Delivery {
	t.Helper()
	ctx := testCtx(t)
	for {
		ds, err := b.Receive(ctx, q, 1)
		if err != nil {
			t.Fatalf("Receive: %v", err)
		}
		if lost() {
			return nil
		}
		if len(ds) > 0 {
			return ds[0]
		}
	}
}

// expectNone receives for wait and fails on any delivery.
func expectNone(t *testing.T, b *sqs.Broker, q string, wait time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	for {
		ds, err := b.Receive(ctx, q, 10)
		for _, d := range ds {
			t.Fatalf("unexpected delivery of %s (attempt %d)", d.Message().ID, d.Attempt())
		}
		if err != nil {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Receive: %v", err)
			}
			return
		}
	}
}

func sameMessage(t *testing.T, got, want *sdk.Message) {
	t.Helper()
	if got.ID != want.ID || got.Type != want.Type || got.IdempotencyKey != want.IdempotencyKey ||
		got.Key != want.Key || got.CorrelationID != want.CorrelationID {
		t.Errorf("fields: got %+v, want %+v", got, want)
	}
	if !maps.Equal(got.Headers, want.Headers) {
		t.Errorf("message %s: headers %q, want %q", want.ID, got.Headers, want.Headers)
	}
	if !bytes.Equal(got.Body, want.Body) {
		t.Errorf("message %s: body of %d bytes differs from the %d published", want.ID, len(got.Body), len(want.Body))
	}
}

// TestEncodingRoundTrip: binary bodies, characters SQS refuses, empty bodies
// and 30 headers (SQS allows 10 attributes) come back exactly.
func TestEncodingRoundTrip(t *testing.T) {
	b := newBroker(t, fastOptions())
	q := declare(t, b, "encoding", false, sqs.QueueConfig{})
	rng := rand.New(rand.NewPCG(1, 2))
	binary := make([]byte, 4096)
	for i := range binary {
		binary[i] = byte(rng.UintN(256))
	}
	headers := map[string]string{}
	for i := range 30 {
		headers["x-h"+strconv.Itoa(i)] = "v" + strconv.Itoa(i)
	}
	headers["x-control"] = "a\x00b\x01c\x1f"
	headers["x-nonchar"] = "\ufffe\uffff"
	headers["x-astral"] = "🚀 𝄞"
	headers["x-quote"] = `"}{\`
	headers["x-empty"] = ""
	headers["naïve ✓ name"] = "value"
	want := []*sdk.Message{
		{ID: sdk.NewID(), Type: "binary", Body: binary, Headers: headers, IdempotencyKey: "ik:1", Key: "k", CorrelationID: "c"},
		{ID: sdk.NewID(), Type: "empty", CorrelationID: "c"},
		{ID: sdk.NewID(), Type: "astral", Body: []byte("emoji 🚀 outside the BMP"), CorrelationID: "c"},
		{ID: sdk.NewID(), Type: "controls", Body: []byte("tab\tCR\rLF\n but NUL \x00"), CorrelationID: "c"},
		{ID: sdk.NewID(), Type: "text", Body: []byte(`{"json": "body", "é": 1}`), CorrelationID: "c"},
		{ID: sdk.NewID(), Type: "base64-looking", Body: []byte("aGVsbG8="), CorrelationID: "c"},
		{ID: sdk.NewID(), Type: "dash", Body: []byte("-"), CorrelationID: "c"},
		{ID: sdk.NewID(), Type: "invalid-utf8", Body: []byte{0xff, 0xfe, 'a'}, CorrelationID: "c"},
	}
	pub := make([]*sdk.Message, len(want))
	for i, m := range want {
		pub[i] = m.Clone()
	}
	if err := b.Publish(testCtx(t), q, pub...); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	got := map[string]*sdk.Message{}
	receiveEach(t, b, q, len(want), func(d sdk.Delivery) {
		got[d.Message().ID] = d.Message()
		if err := d.Ack(testCtx(t)); err != nil {
			t.Fatalf("Ack: %v", err)
		}
	})
	for _, w := range want {
		g, ok := got[w.ID]
		if !ok {
			t.Errorf("message %s (%s) not received", w.ID, w.Type)
			continue
		}
		sameMessage(t, g, w)
	}
}

// TestForeignMessage: a message sent by another producer (no berth
// attribute) is delivered with its SQS ID, raw body and attributes as headers.
func TestForeignMessage(t *testing.T) {
	b := newBroker(t, fastOptions())
	q := declare(t, b, "foreign", false, sqs.QueueConfig{})
	ctx := testCtx(t)
	url, err := b.Client().GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(q)})
	if err != nil {
		t.Fatal(err)
	}
	out, err := b.Client().SendMessage(ctx, &awssqs.SendMessageInput{
		QueueUrl:    url.QueueUrl,
		MessageBody: aws.String("from elsewhere"),
		MessageAttributes: map[string]sqstypes.MessageAttributeValue{
			"traceparent": {DataType: aws.String("String"), StringValue: aws.String("00-abc-def-01")},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	d := receiveN(t, b, q, 1)[0]
	m := d.Message()
	if m.ID != aws.ToString(out.MessageId) || string(m.Body) != "from elsewhere" || m.Header("traceparent") != "00-abc-def-01" {
		t.Errorf("foreign message decoded as %+v", m)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPublishPartialFailure: an entry SQS refuses (here: larger than the
// queue's MaximumMessageSize, lowered by another broker after b declared
// the queue, so that b's Publish does not know it yet) is named in a
// PublishError; the others arrive.
func TestPublishPartialFailure(t *testing.T) {
	small := newBroker(t, sqs.Options{MaxWireSize: 1024, VisibilityTimeout: time.Second, WaitTime: time.Second})
	b := newBroker(t, fastOptions())
	q := declare(t, b, "partial", false, sqs.QueueConfig{}) // MaximumMessageSize 1 MiB, known to b
	// MaximumMessageSize now 1024.
	if err := small.EnsureQueue(testCtx(t), q, sqs.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	ok1 := &sdk.Message{Type: "ok", Body: []byte("fits")}
	big := &sdk.Message{Type: "big", Body: bytes.Repeat([]byte("x"), 2000)}
	ok2 := &sdk.Message{Type: "ok", Body: []byte("fits too")}
	err := b.Publish(testCtx(t), q, ok1, big, ok2)
	var pe *sdk.PublishError
	if !errors.As(err, &pe) {
		t.Fatalf("Publish: %v, want *sdk.PublishError", err)
	}
	if len(pe.Failed) != 1 || pe.Failed[big.ID] == nil {
		t.Fatalf("PublishError.Failed = %v, want only %s", pe.Failed, big.ID)
	}
	var ee *sqs.EntryError
	if !errors.As(pe.Failed[big.ID], &ee) || !ee.SenderFault {
		t.Errorf("failure of %s: %v, want a sender-fault *sqs.EntryError", big.ID, pe.Failed[big.ID])
	}
	got := map[string]bool{}
	receiveEach(t, b, q, 2, func(d sdk.Delivery) {
		got[d.Message().ID] = true
		_ = d.Ack(testCtx(t))
	})
	if !got[ok1.ID] || !got[ok2.ID] {
		t.Errorf("received %v, want %s and %s", got, ok1.ID, ok2.ID)
	}
}

// TestPublishChecks: delays SQS cannot honour and encoded messages over the
// wire limit are refused before anything is sent.
func TestPublishChecks(t *testing.T) {
	t.Parallel() // sleep-bound: waits out leases and delays
	b := newBroker(t, fastOptions())
	q := declare(t, b, "checks", false, sqs.QueueConfig{})
	fq := declare(t, b, "checks", true, sqs.QueueConfig{})
	ctx := testCtx(t)

	late := &sdk.Message{Type: "late", Body: []byte("x"), Delay: 16 * time.Minute}
	err := b.Publish(ctx, q, &sdk.Message{Type: "fine", Body: []byte("x")}, late)
	var de *sqs.DelayError
	if !errors.As(err, &de) || !errors.Is(err, sdk.ErrInvalidMessage) || de.ID != late.ID {
		t.Errorf("Publish with a 16-minute delay: %v, want *sqs.DelayError for %s", err, late.ID)
	}
	err = b.Publish(ctx, fq, &sdk.Message{Type: "fifo-delay", Body: []byte("x"), Delay: time.Second})
	if !errors.As(err, &de) || de.Max != 0 {
		t.Errorf("Publish with a delay to a FIFO queue: %v, want *sqs.DelayError", err)
	}
	// 200 KB of control characters in a header: within MaxMessageSize, but
	// six times larger once escaped for SQS.
	wide := &sdk.Message{Type: "wide", Headers: map[string]string{"x": strings.Repeat("\x01", 200<<10)}}
	err = b.Publish(ctx, q, wide)
	var tl *sdk.MessageTooLargeError
	// The limit is MaxWireSize less the room kept for its dead letter.
	if !errors.As(err, &tl) || tl.Limit != sqs.MaxWireSize-sqs.CopyReserve || tl.Size <= tl.Limit {
		t.Errorf("Publish of a message too large once encoded: %v, want *sdk.MessageTooLargeError with limit %d",
			err, sqs.MaxWireSize-sqs.CopyReserve)
	}
	if err := b.Publish(ctx, "has.dot", &sdk.Message{Body: []byte("x")}); !errors.Is(err, sdk.ErrInvalidQueue) {
		t.Errorf("Publish to a name SQS refuses: %v, want ErrInvalidQueue", err)
	}
	if _, err := b.Receive(ctx, "missing_"+suffix(), 1); !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("Receive from a missing queue: %v, want ErrNotFound", err)
	}
	expectNone(t, b, q, 1500*time.Millisecond)
}

// visibilities records the VisibilityTimeout of every ChangeMessageVisibility
// call the broker makes.
type visibilities struct {
	mu   sync.Mutex
	secs []int32
}

// option is the APIOptions entry that records into v.
func (v *visibilities) option(st *middleware.Stack) error {
	return st.Initialize.Add(middleware.InitializeMiddlewareFunc("berthTestVisibilities",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			if p, ok := in.Parameters.(*awssqs.ChangeMessageVisibilityInput); ok {
				v.mu.Lock()
				v.secs = append(v.secs, p.VisibilityTimeout)
				v.mu.Unlock()
			}
			return next.HandleInitialize(ctx, in)
		}), middleware.After)
}

// get returns the timeouts recorded so far.
func (v *visibilities) get() []int32 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.secs)
}

// ceilingSecs is SQS's 12-hour visibility ceiling in seconds.
const ceilingSecs = int32(sqs.MaxVisibility / time.Second)

// TestLeaseCeiling: a lease beyond 12 hours from receipt is refused with a
// typed error and changes nothing; a retry delay beyond it is clamped to
// what the ceiling allows (sdk.MaxDelay, which the Worker gives at most,
// always ends after the ceiling, the receipt being earlier).
func TestLeaseCeiling(t *testing.T) {
	v := &visibilities{}
	b := newBroker(t, fastOptions(), v.option)
	q := declare(t, b, "ceiling", false, sqs.QueueConfig{})
	ctx := testCtx(t)
	if err := b.Publish(ctx, q, &sdk.Message{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	d := receiveN(t, b, q, 1)[0]
	var ce *sqs.LeaseCeilingError
	if err := d.ExtendLease(ctx, 13*time.Hour); !errors.As(err, &ce) || !errors.Is(err, sqs.ErrLeaseCeiling) {
		t.Errorf("ExtendLease(13h): %v, want *sqs.LeaseCeilingError", err)
	}
	if err := d.ExtendLease(ctx, 12*time.Hour); !errors.Is(err, sqs.ErrLeaseCeiling) {
		t.Errorf("ExtendLease(12h) after the receipt: %v, want ErrLeaseCeiling", err)
	}
	if got := v.get(); len(got) != 0 {
		t.Errorf("refused extensions sent ChangeMessageVisibility %v, want none", got)
	}
	if err := d.ExtendLease(ctx, 5*time.Second); err != nil {
		t.Errorf("ExtendLease(5s): %v", err)
	}
	if err := d.Retry(ctx, sdk.MaxDelay, nil); err != nil {
		t.Fatalf("Retry(MaxDelay) after the receipt: %v, want it clamped to the ceiling", err)
	}
	got := v.get()
	if len(got) != 2 || got[0] != 5 {
		t.Fatalf("ChangeMessageVisibility timeouts %v, want [5 <clamped>]", got)
	}
	// Clamped below 12 h (the receipt was earlier), and not to nothing.
	if s := got[1]; s >= ceilingSecs || s < ceilingSecs-3600 {
		t.Errorf("Retry(MaxDelay) sent VisibilityTimeout %d, want just under %d", s, ceilingSecs)
	}
	if err := d.Ack(ctx); !errors.Is(err, sdk.ErrAlreadySettled) {
		t.Errorf("Ack after Retry: %v, want ErrAlreadySettled", err)
	}
	expectNone(t, b, q, 1500*time.Millisecond)
}

// TestLeaseCeilingHugeDuration: a lease duration too long for SQS's int32
// seconds (a "forever" such as math.MaxInt64, or 100 years) is refused like
// any other beyond the 12-hour ceiling, with a *LeaseCeilingError and no call
// to SQS, rather than wrapping around to a negative VisibilityTimeout that
// SQS refuses with InvalidParameterValue (which real SQS also uses for stale
// receipts, so the delivery would pass for lost). The delivery stays usable;
// a retry with such a delay is clamped to the ceiling, never wrapped.
func TestLeaseCeilingHugeDuration(t *testing.T) {
	c := newCalls()
	v := &visibilities{}
	b := newBroker(t, fastOptions(), c.option, v.option)
	q := declare(t, b, "ceilinghuge", false, sqs.QueueConfig{})
	ctx := testCtx(t)
	if err := b.Publish(ctx, q, &sdk.Message{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	d := receiveN(t, b, q, 1)[0]
	c.reset()
	for _, dur := range []time.Duration{100 * 365 * 24 * time.Hour, math.MaxInt64} {
		if err := d.ExtendLease(ctx, dur); !errors.Is(err, sqs.ErrLeaseCeiling) {
			t.Errorf("ExtendLease(%s): %v, want ErrLeaseCeiling", dur, err)
		}
	}
	if n := c.get("ChangeMessageVisibility"); n != 0 {
		t.Errorf("%d ChangeMessageVisibility calls for leases beyond the ceiling, want none", n)
	}
	if err := d.Retry(ctx, math.MaxInt64, nil); err != nil {
		t.Fatalf("Retry(MaxInt64): %v, want it clamped to the ceiling", err)
	}
	if got := v.get(); len(got) != 1 || got[0] <= 0 || got[0] >= ceilingSecs {
		t.Errorf("Retry(MaxInt64) sent VisibilityTimeout %v, want one in (0, %d)", got, ceilingSecs)
	}
}

// TestAckBatchesDeletes: acks share DeleteMessageBatch calls, and Flush
// sends what is buffered.
func TestAckBatchesDeletes(t *testing.T) {
	c := newCalls()
	b := newBroker(t, sqs.Options{VisibilityTimeout: 10 * time.Second, WaitTime: time.Second, AckInterval: time.Hour}, c.option)
	q := declare(t, b, "batching", false, sqs.QueueConfig{})
	ctx := testCtx(t)
	const n = 95
	msgs := make([]*sdk.Message, n)
	for i := range msgs {
		msgs[i] = &sdk.Message{Body: []byte(strconv.Itoa(i))}
	}
	if err := b.Publish(ctx, q, msgs...); err != nil {
		t.Fatal(err)
	}
	if got := c.get("SendMessageBatch"); got != 10 {
		t.Errorf("%d SendMessageBatch calls for %d messages, want 10", got, n)
	}
	c.reset()
	// Each delivery is acked as it comes: a ReceiveMessage answer the
	// emulator loses now and then hides the messages it took for the
	// visibility timeout, and deliveries held while they come back would
	// outlive their own lease.
	receiveEach(t, b, q, n, func(d sdk.Delivery) {
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	})
	// Full batches went to the sender as they filled (it may still be
	// sending the last); the 5 left wait for the interval (an hour here).
	if got := c.get("DeleteMessageBatch"); got > n/10 {
		t.Errorf("%d DeleteMessageBatch calls before Flush for %d acks, want at most %d (full batches only)", got, n, n/10)
	}
	if err := b.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	if got := c.get("DeleteMessageBatch"); got != n/10+1 {
		t.Errorf("%d DeleteMessageBatch calls after Flush, want %d", got, n/10+1)
	}
	if got := c.get("DeleteMessage"); got != 0 {
		t.Errorf("%d single DeleteMessage calls, want 0", got)
	}
	st, err := b.Stats(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready != 0 || st.InFlight != 0 {
		t.Errorf("after acks and Flush: %+v, want an empty queue", st)
	}
}

// TestCloseSendsBufferedAcks: Close deletes what Ack buffered.
func TestCloseSendsBufferedAcks(t *testing.T) {
	b := newBroker(t, sqs.Options{VisibilityTimeout: 30 * time.Second, WaitTime: time.Second, AckInterval: time.Hour})
	q := declare(t, b, "closeflush", false, sqs.QueueConfig{})
	ctx := testCtx(t)
	if err := b.Publish(ctx, q, &sdk.Message{Body: []byte("a")}, &sdk.Message{Body: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	receiveEach(t, b, q, 2, func(d sdk.Delivery) {
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	})
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := b.Flush(ctx); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("Flush after Close: %v, want ErrClosed", err)
	}
	other := newBroker(t, fastOptions())
	st, err := other.Stats(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready != 0 || st.InFlight != 0 {
		t.Errorf("after Close: %+v, want both messages deleted", st)
	}
}

// TestAckFailureSurfaced: a delete SQS refuses is returned by the next
// Flush as an *sqs.AckError, not dropped.
func TestAckFailureSurfaced(t *testing.T) {
	b := newBroker(t, sqs.Options{VisibilityTimeout: 30 * time.Second, WaitTime: time.Second, AckInterval: time.Hour})
	q := declare(t, b, "ackfail", false, sqs.QueueConfig{})
	ctx := testCtx(t)
	if err := b.Publish(ctx, q, &sdk.Message{Body: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	d := receiveN(t, b, q, 1)[0]
	deleteQueue(t, q) // the delete will find no queue
	if err := d.Ack(ctx); err != nil {
		t.Fatalf("Ack (buffered): %v", err)
	}
	err := b.Flush(ctx)
	var ae *sqs.AckError
	if !errors.As(err, &ae) || ae.ID != d.Message().ID {
		t.Fatalf("Flush after a refused delete: %v, want *sqs.AckError for %s", err, d.Message().ID)
	}
	if err := b.Flush(ctx); err != nil {
		t.Errorf("second Flush: %v, want nil (the failure was reported once)", err)
	}
	syncB := newBroker(t, sqs.Options{VisibilityTimeout: 30 * time.Second, WaitTime: time.Second, SyncAck: true})
	q2 := declare(t, syncB, "ackfail", false, sqs.QueueConfig{})
	if err := syncB.Publish(ctx, q2, &sdk.Message{Body: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	d = receiveN(t, syncB, q2, 1)[0]
	deleteQueue(t, q2)
	if err := d.Ack(ctx); !errors.As(err, &ae) {
		t.Errorf("SyncAck Ack of a refused delete: %v, want *sqs.AckError", err)
	}
}

// TestStats reads SQS's counters for the queue and its dead-letter queue.
// A lost ReceiveMessage answer would leave one more message in flight:
// cleanRun.
func TestStats(t *testing.T) {
	cleanRun(t, func(logger *slog.Logger, lost func() bool) bool {
		b := newBroker(t, sqs.Options{VisibilityTimeout: 30 * time.Second, WaitTime: time.Second, Logger: logger})
		q := declare(t, b, "stats", false, sqs.QueueConfig{})
		ctx := testCtx(t)
		delayed := &sdk.Message{Body: []byte("later"), Delay: time.Minute}
		if err := b.Publish(ctx, q, &sdk.Message{Body: []byte("1")}, &sdk.Message{Body: []byte("2")}, &sdk.Message{Body: []byte("3")}, delayed); err != nil {
			t.Fatal(err)
		}
		want := func(ready, delayed, inFlight, dead int64) {
			t.Helper()
			st, err := b.Stats(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			if st.Queue != q || st.Ready != ready || st.Delayed != delayed || st.InFlight != inFlight || st.DeadLettered != dead {
				t.Errorf("Stats = %+v, want ready %d, delayed %d, in flight %d, dead-lettered %d", st, ready, delayed, inFlight, dead)
			}
		}
		want(3, 1, 0, 0)
		d := receiveCounted(t, b, q, lost)
		if d == nil {
			return false
		}
		want(2, 1, 1, 0)
		if err := d.DeadLetter(ctx, sdk.Permanent(errors.New("bad"))); err != nil {
			t.Fatal(err)
		}
		want(2, 1, 0, 1)
		return true
	})
}

// TestStatsLongQueueWithoutDeadLetterQueue: a queue made outside berth
// without a redrive policy has no dead-letter queue, and Stats reports it
// with DeadLettered 0, whatever the length of its name. For a name of 77 to
// 80 characters, the conventional dead-letter queue name (with "-dlq") is
// longer than SQS allows, and Stats failed with ErrInvalidQueue naming that
// queue, which the caller never mentioned; dead-letter calls now say
// ErrNotFound, as for a short name.
func TestStatsLongQueueWithoutDeadLetterQueue(t *testing.T) {
	ctx := testCtx(t)
	raw := newClient(t)
	b := newBroker(t, fastOptions())
	for _, name := range []string{"nodlq_" + suffix(), "nodlq_" + suffix() + strings.Repeat("x", 80-18)} {
		out, err := raw.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(name)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = raw.DeleteQueue(context.Background(), &awssqs.DeleteQueueInput{QueueUrl: out.QueueUrl}) })
		if err := b.Publish(ctx, name, &sdk.Message{Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		st, err := b.Stats(ctx, name)
		if err != nil || st.Ready != 1 || st.DeadLettered != 0 {
			t.Errorf("Stats(%d-character queue without a dead-letter queue) = %+v, %v; want 1 ready, none dead-lettered", len(name), st, err)
		}
		if _, err := b.ListDeadLetters(ctx, name, 10); !errors.Is(err, sdk.ErrNotFound) {
			t.Errorf("ListDeadLetters(%d-character queue without a dead-letter queue) = %v, want ErrNotFound", len(name), err)
		}
	}
}

// TestEnsureQueue: declaring twice succeeds, a changed setting converges,
// and names SQS cannot take are refused.
func TestEnsureQueue(t *testing.T) {
	b := newBroker(t, fastOptions())
	q := declare(t, b, "ensure", false, sqs.QueueConfig{MaxReceiveCount: 4})
	ctx := testCtx(t)
	if err := b.EnsureQueue(ctx, q, sqs.QueueConfig{MaxReceiveCount: 4}); err != nil {
		t.Errorf("second EnsureQueue: %v", err)
	}
	if err := b.EnsureQueue(ctx, q, sqs.QueueConfig{MaxReceiveCount: 7}); err != nil {
		t.Errorf("EnsureQueue with another MaxReceiveCount: %v", err)
	}
	url, err := b.Client().GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(q)})
	if err != nil {
		t.Fatal(err)
	}
	attrs, err := b.Client().GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{
		QueueUrl: url.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameRedrivePolicy},
	})
	if err != nil {
		t.Fatal(err)
	}
	if p := attrs.Attributes["RedrivePolicy"]; !strings.Contains(p, `"7"`) && !strings.Contains(p, `:7`) {
		t.Errorf("RedrivePolicy %s, want maxReceiveCount 7", p)
	}
	for _, name := range []string{"has.dot", strings.Repeat("a", 77), "bad name"} {
		if err := b.DeclareQueue(ctx, name); !errors.Is(err, sdk.ErrInvalidQueue) {
			t.Errorf("DeclareQueue(%q): %v, want ErrInvalidQueue", name, err)
		}
	}
}

// TestOptions: invalid options are refused by New.
func TestOptions(t *testing.T) {
	if _, err := sqs.New(nil, sqs.Options{}); err == nil {
		t.Error("New(nil client) succeeded")
	}
	client := newClient(t)
	for _, o := range []sqs.Options{
		{VisibilityTimeout: 13 * time.Hour},
		{VisibilityTimeout: -time.Second},
		{WaitTime: 21 * time.Second},
		{MaxReceiveCount: 1001},
		{DeadLetterSuffix: ".dlq"},
		{MaxWireSize: 2 << 20},
		{MaxMessageSize: 2 << 20},
		{AckInterval: -time.Millisecond},
	} {
		if b, err := sqs.New(client, o); err == nil {
			_ = b.Close()
			t.Errorf("New(%+v) succeeded", o)
		}
	}
}

// TestSlowHandlerWithoutHeartbeatIsRedelivered: with heartbeats off, a
// handler slower than the visibility timeout sees its message delivered
// again, to another handler, while it still runs.
func TestSlowHandlerWithoutHeartbeatIsRedelivered(t *testing.T) {
	t.Parallel() // sleep-bound: waits out leases and delays
	starts := runSlowHandler(t, -1, time.Second)
	if len(starts) < 2 || starts[0] != 1 || starts[1] != 2 {
		t.Errorf("attempts seen by the handler: %v, want 1 then 2 (redelivered while the first ran)", starts)
	}
}

// TestHeartbeatKeepsSlowHandler: with the Worker's heartbeat, the same slow
// handler runs once and its message is acked.
func TestHeartbeatKeepsSlowHandler(t *testing.T) {
	t.Parallel() // sleep-bound: waits out leases and delays
	// A visibility timeout of 2s: the default heartbeat (a third of it) then
	// leaves a second of slack for a stall of the test process or of the
	// emulator; at 1s, a 0.5s stall cost the lease.
	starts := runSlowHandler(t, 0, 2*time.Second)
	if len(starts) != 1 {
		t.Errorf("attempts seen by the handler: %v, want one run (the heartbeat kept the lease)", starts)
	}
}

// runSlowHandler runs a Worker (heartbeat interval hb: 0 default, negative
// off) on a queue of visibility timeout lease, whose handler takes 3 of them
// on the first attempt, and returns the attempts the handler saw.
func runSlowHandler(t *testing.T, hb, lease time.Duration) []int {
	b := newBroker(t, sqs.Options{VisibilityTimeout: lease, WaitTime: time.Second})
	q := declare(t, b, "slow", false, sqs.QueueConfig{})
	ctx := testCtx(t)
	m := &sdk.Message{Type: "slow", Body: []byte("slow")}
	if err := b.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		starts []int
		done   = make(chan struct{})
		once   sync.Once
	)
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		mu.Lock()
		starts = append(starts, d.Attempt())
		first := len(starts) == 1
		mu.Unlock()
		if first {
			select {
			case <-time.After(3 * lease):
			case <-ctx.Done():
			}
		}
		once.Do(func() { close(done) })
		return nil
	})
	w, err := sdk.NewWorker(b, h, sdk.WorkerOptions{Queue: q, Concurrency: 2, Lease: lease, HeartbeatInterval: hb})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- w.Run(wctx) }()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the handler never finished")
	}
	time.Sleep(2 * lease) // a lost lease would show as a redelivery by now
	cancel()
	if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Worker.Run: %v", err)
	}
	if hb >= 0 {
		st, err := b.Stats(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if st.Ready != 0 || st.InFlight != 0 || st.DeadLettered != 0 {
			t.Errorf("after the worker: %+v, want the message acked", st)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	return append([]int(nil), starts...)
}

// TestRedrivePolicyMovesNeverSettled: a message received MaxReceiveCount
// times and never settled is moved to the dead-letter queue by SQS, listed
// there as a poison message, and redriven with its attempts reset. A lost
// ReceiveMessage answer would count one receive more: cleanRun.
func TestRedrivePolicyMovesNeverSettled(t *testing.T) {
	t.Parallel() // sleep-bound: waits out leases and delays
	cleanRun(t, func(logger *slog.Logger, lost func() bool) bool {
		return redrivePolicyScenario(t, logger, lost)
	})
}

func redrivePolicyScenario(t *testing.T, logger *slog.Logger, lost func() bool) bool {
	opts := fastOptions()
	opts.Logger = logger
	b := newBroker(t, opts)
	q := declare(t, b, "poison", false, sqs.QueueConfig{MaxReceiveCount: 2})
	ctx := testCtx(t)
	m := &sdk.Message{Type: "poison", Body: []byte("kills workers"), Headers: map[string]string{"x-user": "kept"}}
	if err := b.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	for attempt := 1; attempt <= 2; attempt++ {
		d := receiveCounted(t, b, q, lost)
		if d == nil {
			return false
		}
		if d.Attempt() != attempt {
			t.Fatalf("Attempt() = %d, want %d", d.Attempt(), attempt)
		}
		// never settled: the lease runs out
	}
	// Receive until SQS moves it (fauxqs moves it on the receive that would
	// exceed maxReceiveCount). Each Receive runs its whole long poll: a poll
	// cancelled early could, on fauxqs as on SQS, still take the redriven
	// message below and hide it for a visibility timeout.
	for st := (sdk.QueueStats{}); st.DeadLettered != 1; {
		ds, err := b.Receive(ctx, q, 10)
		if err != nil {
			t.Fatalf("Receive: %v", err)
		}
		for _, d := range ds {
			t.Fatalf("delivered a third time (attempt %d) despite maxReceiveCount 2", d.Attempt())
		}
		if st, err = b.Stats(ctx, q); err != nil {
			t.Fatal(err)
		}
		if st.Ready+st.InFlight+st.DeadLettered != 1 {
			t.Fatalf("Stats = %+v, want the one message somewhere", st)
		}
	}
	if lost() {
		return false
	}
	dead, err := b.GetDeadLetter(ctx, q, m.ID)
	if err != nil {
		t.Fatalf("GetDeadLetter: %v", err)
	}
	if dead.Header(sdk.HeaderDeadLetterReason) != sdk.ErrMaxDeliveries.Error() ||
		dead.Header(sdk.HeaderDeadLetterClass) != string(sdk.ClassPoison) ||
		dead.Header(sdk.HeaderDeadLetterAttempts) != "2" || dead.Header(sdk.HeaderDeadLetterQueue) != q ||
		dead.Header("x-user") != "kept" {
		t.Errorf("dead letter headers %q", dead.Headers)
	}
	if n, err := b.RedriveDeadLetters(ctx, q); err != nil || n != 1 {
		t.Fatalf("RedriveDeadLetters = %d, %v; want 1", n, err)
	}
	d := receiveCounted(t, b, q, lost)
	if d == nil {
		return false
	}
	if d.Message().ID != m.ID || d.Attempt() != 1 || d.Message().Header(sdk.HeaderRedriveCount) != "1" {
		t.Errorf("redriven: %s attempt %d, headers %q; want %s attempt 1, redrive count 1", d.Message().ID, d.Attempt(), d.Message().Headers, m.ID)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	return true
}

// TestFIFO: a duplicate within the deduplication window is dropped, order
// within a group holds, and dead letters and redrive work on FIFO queues.
// A lost ReceiveMessage answer would count one receive more of the redriven
// message: cleanRun.
func TestFIFO(t *testing.T) {
	t.Parallel() // sleep-bound: waits out leases and delays
	cleanRun(t, func(logger *slog.Logger, lost func() bool) bool {
		return fifoScenario(t, logger, lost)
	})
}

func fifoScenario(t *testing.T, logger *slog.Logger, lost func() bool) bool {
	b := newBroker(t, sqs.Options{VisibilityTimeout: 5 * time.Second, WaitTime: time.Second, SyncAck: true, Logger: logger})
	q := declare(t, b, "fifo", true, sqs.QueueConfig{})
	ctx := testCtx(t)

	first := &sdk.Message{Type: "charge", IdempotencyKey: "charge:order_1:v1", Key: "order_1", Body: []byte("1")}
	dup := &sdk.Message{Type: "charge", IdempotencyKey: "charge:order_1:v1", Key: "order_1", Body: []byte("1 again")}
	if err := b.Publish(ctx, q, first); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, q, dup); err != nil {
		t.Fatal(err)
	}
	d := receiveN(t, b, q, 1)[0]
	if d.Message().ID != first.ID {
		t.Fatalf("got %s, want the first publish %s", d.Message().ID, first.ID)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	expectNone(t, b, q, 1500*time.Millisecond) // the duplicate was dropped

	// Two interleaved groups, published in batches; long keys and
	// idempotency keys are hashed to fit.
	const perGroup = 12
	groups := []string{"g-a", strings.Repeat("g-b", 50)}
	var msgs []*sdk.Message
	for i := range perGroup {
		for _, g := range groups {
			msgs = append(msgs, &sdk.Message{Type: "seq", Key: g, IdempotencyKey: strings.Repeat("k", 130) + g + strconv.Itoa(i), Body: []byte(strconv.Itoa(i))})
		}
	}
	if err := b.Publish(ctx, q, msgs...); err != nil {
		t.Fatal(err)
	}
	next := map[string]int{}
	for received := 0; received < len(msgs); {
		ds, err := b.Receive(ctx, q, 10)
		if err != nil {
			t.Fatalf("Receive: %v", err)
		}
		for _, d := range ds {
			m := d.Message()
			if got := string(m.Body); got != strconv.Itoa(next[m.Key]) {
				t.Fatalf("group %.8s…: got %s, want %d: order broken", m.Key, got, next[m.Key])
			}
			next[m.Key]++
			received++
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Dead letter and redrive keep the group and are not deduplicated away.
	dl := &sdk.Message{Type: "dl", Key: "order_2", IdempotencyKey: "charge:order_2:v1", Body: []byte("bad")}
	if err := b.Publish(ctx, q, dl); err != nil {
		t.Fatal(err)
	}
	d = receiveN(t, b, q, 1)[0]
	if err := d.DeadLetter(ctx, sdk.Permanent(errors.New("card declined"))); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	if n, err := b.RedriveDeadLetters(ctx, q, dl.ID); err != nil || n != 1 {
		t.Fatalf("RedriveDeadLetters = %d, %v", n, err)
	}
	if d = receiveCounted(t, b, q, lost); d == nil {
		return false
	}
	if d.Message().ID != dl.ID || d.Message().Key != "order_2" || d.Attempt() != 1 {
		t.Errorf("redriven FIFO message: %s key %q attempt %d", d.Message().ID, d.Message().Key, d.Attempt())
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	return true
}

// TestDeadLetterScanLeavesMessages: listing does not consume dead letters,
// and a cancelled scan makes them visible again.
func TestDeadLetterScanLeavesMessages(t *testing.T) {
	b := newBroker(t, fastOptions())
	q := declare(t, b, "scan", false, sqs.QueueConfig{})
	ctx := testCtx(t)
	var msgs []*sdk.Message
	for i := range 25 {
		msgs = append(msgs, &sdk.Message{Type: "scan", Body: []byte(fmt.Sprint(i))})
	}
	if err := b.Publish(ctx, q, msgs...); err != nil {
		t.Fatal(err)
	}
	receiveEach(t, b, q, len(msgs), func(d sdk.Delivery) {
		if err := d.DeadLetter(ctx, errors.New("boom")); err != nil {
			t.Fatal(err)
		}
	})
	for range 2 {
		got, err := b.ListDeadLetters(ctx, q, 100)
		if err != nil || len(got) != len(msgs) {
			t.Fatalf("ListDeadLetters = %d messages, %v; want %d", len(got), err, len(msgs))
		}
	}
	if got, err := b.ListDeadLetters(ctx, q, 7); err != nil || len(got) != 7 {
		t.Fatalf("ListDeadLetters(limit 7) = %d, %v", len(got), err)
	}
	if n, err := b.PurgeDeadLetters(ctx, q); err != nil || n != len(msgs) {
		t.Fatalf("PurgeDeadLetters = %d, %v; want %d", n, err, len(msgs))
	}
}

// TestForeignFIFOMessageKeepsGroup: a message another producer sent to a
// FIFO queue is delivered with its MessageGroupId as Key (the contract's
// Key is the FIFO message group), and its dead letter keeps that group. It
// was delivered with an empty Key, and DeadLetter put the copy in
// Options.DefaultGroup: every foreign dead letter in one group, which a
// redrive then carried back to the queue.
func TestForeignFIFOMessageKeepsGroup(t *testing.T) {
	b := newBroker(t, fastOptions())
	q := declare(t, b, "foreignfifo", true, sqs.QueueConfig{})
	ctx := testCtx(t)
	url, err := b.Client().GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(q)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Client().SendMessage(ctx, &awssqs.SendMessageInput{
		QueueUrl:               url.QueueUrl,
		MessageBody:            aws.String("from elsewhere"),
		MessageGroupId:         aws.String("customer-7"),
		MessageDeduplicationId: aws.String("dedup-" + q),
	}); err != nil {
		t.Fatal(err)
	}
	d := receiveN(t, b, q, 1)[0]
	if got := d.Message().Key; got != "customer-7" {
		t.Errorf("Key = %q, want the MessageGroupId %q", got, "customer-7")
	}
	if err := d.DeadLetter(ctx, errors.New("poison")); err != nil {
		t.Fatal(err)
	}
	dlq, err := b.Client().GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(strings.TrimSuffix(q, ".fifo") + "-dlq.fifo")})
	if err != nil {
		t.Fatal(err)
	}
	out, err := b.Client().ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{
		QueueUrl:                    dlq.QueueUrl,
		WaitTimeSeconds:             1,
		MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameMessageGroupId},
	})
	if err != nil || len(out.Messages) != 1 {
		t.Fatalf("ReceiveMessage from the dead-letter queue: %d messages, %v; want 1", len(out.Messages), err)
	}
	if got := out.Messages[0].Attributes[string(sqstypes.MessageSystemAttributeNameMessageGroupId)]; got != "customer-7" {
		t.Errorf("dead letter's MessageGroupId = %q, want %q", got, "customer-7")
	}
}
