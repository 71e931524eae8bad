package sdk_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/sdk"
)

// hopRecorder is an Observer recording every settlement with the message's
// due header and the time.
type hopRecorder struct {
	mu   sync.Mutex
	acks int
}

func (h *hopRecorder) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }
func (h *hopRecorder) Settled(_ context.Context, _ sdk.Delivery, s sdk.Settlement) {
	h.mu.Lock()
	if s.Action == sdk.ActionAck {
		h.acks++
	}
	h.mu.Unlock()
}

// A delay beyond the limit arrives in hops of at most the limit and runs
// once, never before it is due; a delay within the limit is left alone.
func TestLongDelayHops(t *testing.T) {
	b := newMem(t)
	const limit = 40 * time.Millisecond
	ld := sdk.LongDelay{Publisher: b, Limit: limit}
	ran := make(chan time.Time, 10)
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		if d.Message().Body != nil && string(d.Message().Body) == "long" {
			ran <- time.Now()
		}
		return nil
	})
	rec := &hopRecorder{}
	w, err := sdk.NewWorker(b, h, sdk.WorkerOptions{Queue: "later", Logger: mqQuiet(),
		Middleware: []sdk.Middleware{ld.Middleware()}, Observers: []sdk.Observer{rec}})
	if err != nil {
		t.Fatal(err)
	}
	runMQ(t, w)

	published := time.Now()
	m := &sdk.Message{Type: "remind", Body: []byte("long"), Delay: 250 * time.Millisecond}
	if err := ld.Publish(context.Background(), "later", m); err != nil {
		t.Fatal(err)
	}
	if m.Delay != limit || m.Header(sdk.HeaderDueAt) == "" {
		t.Fatalf("published delay %s, due %q: want the limit and a due time", m.Delay, m.Header(sdk.HeaderDueAt))
	}
	due, err := time.Parse(time.RFC3339Nano, m.Header(sdk.HeaderDueAt))
	if err != nil {
		t.Fatal(err)
	}
	if due.Before(published.Add(250 * time.Millisecond)) {
		t.Fatalf("due %s before publish + delay", due)
	}
	var at time.Time
	select {
	case at = <-ran:
	case <-time.After(30 * time.Second):
		t.Fatal("the long-delayed job never ran")
	}
	if at.Before(due) {
		t.Errorf("ran %s before it was due", due.Sub(at))
	}
	select {
	case <-ran:
		t.Error("ran twice")
	case <-time.After(100 * time.Millisecond):
	}
	rec.mu.Lock()
	hops := rec.acks - 1
	rec.mu.Unlock()
	if hops < 1 || hops > 6 { // 250ms in hops of at most 40ms: at most 6 (each hop waits at least the remaining time or the limit)
		t.Errorf("%d hops, want 1..6", hops)
	}

	short := &sdk.Message{Type: "remind", Body: []byte("short"), Delay: limit / 2}
	if err := ld.Publish(context.Background(), "later", short); err != nil {
		t.Fatal(err)
	}
	if short.Header(sdk.HeaderDueAt) != "" || short.Delay != limit/2 {
		t.Errorf("a delay within the limit was changed: %s, %q", short.Delay, short.Header(sdk.HeaderDueAt))
	}
}

// Delays beyond MaxDelay are accepted by LongDelay (the broker sees at most
// Limit), and the hop strips the brokers' own headers.
func TestLongDelayBeyondMaxDelayAndHeaders(t *testing.T) {
	var got []*sdk.Message
	pub := publisherFunc(func(ctx context.Context, queue string, msgs ...*sdk.Message) error {
		if err := sdk.PrepareAll(ctx, queue, msgs, 0); err != nil {
			return err
		}
		got = append(got, msgs...)
		return nil
	})
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ld := sdk.LongDelay{Publisher: pub, Limit: 15 * time.Minute, Now: func() time.Time { return now }}
	m := &sdk.Message{Type: "renewal", Delay: 30 * 24 * time.Hour}
	if err := ld.Publish(context.Background(), "q", m); err != nil {
		t.Fatal(err)
	}
	if m.Delay != 15*time.Minute || m.Header(sdk.HeaderDueAt) != "2026-12-31T00:00:00Z" {
		t.Fatalf("delay %s due %q", m.Delay, m.Header(sdk.HeaderDueAt))
	}

	// A delivery of it 15 minutes later, carrying broker bookkeeping.
	now = now.Add(15 * time.Minute)
	delivered := m.Clone()
	delivered.SetHeader(sdk.HeaderRedriveCount, "1")
	delivered.SetHeader("tenant", "t1")
	d := newFake(1, "renewal")
	*d.Message() = *delivered
	ran := false
	err := ld.Middleware()(sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { ran = true; return nil })).Handle(context.Background(), d)
	if err != nil || ran {
		t.Fatalf("hop: err %v, handler ran %v", err, ran)
	}
	if len(got) != 2 {
		t.Fatalf("%d publishes", len(got))
	}
	hop := got[1]
	if hop.Delay != 15*time.Minute || hop.ID == m.ID || hop.IdempotencyKey != m.ID || hop.CorrelationID != m.CorrelationID || hop.Header("tenant") != "t1" || hop.Header(sdk.HeaderRedriveCount) != "" ||
		hop.Header(sdk.HeaderDueAt) != "2026-12-31T00:00:00Z" || hop.Header(sdk.HeaderHopOf) != m.ID {
		t.Errorf("hop %+v", hop)
	}
	// The next hop names the same first message (the job's ID in the
	// ledger), not the hop it continues.
	d2 := newFake(1, "renewal")
	*d2.Message() = *hop.Clone()
	if err := ld.Middleware()(sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { ran = true; return nil })).Handle(context.Background(), d2); err != nil || ran {
		t.Fatalf("second hop: err %v, handler ran %v", err, ran)
	}
	if len(got) != 3 || got[2].ID == hop.ID || got[2].Header(sdk.HeaderHopOf) != m.ID {
		t.Errorf("second hop %+v, want %s in %s", got[len(got)-1], m.ID, sdk.HeaderHopOf)
	}

	// Due: the handler runs.
	now = time.Date(2026, 12, 31, 0, 0, 0, 1, time.UTC)
	if err := ld.Middleware()(sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { ran = true; return nil })).Handle(context.Background(), d); err != nil || !ran {
		t.Errorf("due: err %v ran %v", err, ran)
	}

	// A failed hop is a transient error.
	failing := sdk.LongDelay{Publisher: publisherFunc(func(context.Context, string, ...*sdk.Message) error { return sdk.ErrUnavailable }), Limit: time.Minute,
		Now: func() time.Time { return time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC) }}
	err = failing.Middleware()(sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil })).Handle(context.Background(), d)
	if !errors.Is(err, sdk.ErrUnavailable) || sdk.Classify(err) != sdk.ClassTransient {
		t.Errorf("failed hop: %v (%s)", err, sdk.Classify(err))
	}
}

// Prepare accepts HeaderDueAt with a valid time only, HeaderHopOf only
// non-empty beside such a HeaderDueAt, and no other reserved header.
func TestPrepareDueAtHeader(t *testing.T) {
	ok := &sdk.Message{Headers: map[string]string{sdk.HeaderDueAt: "2026-12-01T00:00:00Z"}}
	if err := sdk.Prepare(context.Background(), "q", ok, 0); err != nil {
		t.Errorf("valid due: %v", err)
	}
	hop := &sdk.Message{Headers: map[string]string{sdk.HeaderDueAt: "2026-12-01T00:00:00Z", sdk.HeaderHopOf: "first"}}
	if err := sdk.Prepare(context.Background(), "q", hop, 0); err != nil {
		t.Errorf("valid hop: %v", err)
	}
	for _, h := range []map[string]string{
		{sdk.HeaderDueAt: "tomorrow"},
		{sdk.HeaderHopOf: "first"},
		{sdk.HeaderDueAt: "tomorrow", sdk.HeaderHopOf: "first"},
		{sdk.HeaderDueAt: "2026-12-01T00:00:00Z", sdk.HeaderHopOf: ""},
		{"Berth-Due-At": "2026-12-01T00:00:00Z"},
		{sdk.HeaderRedriveCount: "1"},
	} {
		if err := sdk.Prepare(context.Background(), "q", &sdk.Message{Headers: h}, 0); !errors.Is(err, sdk.ErrInvalidMessage) {
			t.Errorf("%v: %v, want ErrInvalidMessage", h, err)
		}
	}
	if err := (sdk.LongDelay{Limit: time.Minute}).Publish(context.Background(), "q", &sdk.Message{}); !errors.Is(err, sdk.ErrInvalidMessage) {
		t.Errorf("LongDelay without a publisher: %v", err)
	}
}

type publisherFunc func(ctx context.Context, queue string, msgs ...*sdk.Message) error

func (f publisherFunc) Publish(ctx context.Context, queue string, msgs ...*sdk.Message) error {
	return f(ctx, queue, msgs...)
}

// A message whose due header was set without LongDelay.Publish (Prepare
// accepts it) has no idempotency key; its hops carry the first message's ID
// as their key, so that the copies a crash between a hop's publish and its
// ack leaves are one operation.
func TestLongDelayHopKeysUnkeyedMessage(t *testing.T) {
	b := newMem(t)
	const limit = 30 * time.Millisecond
	ld := sdk.LongDelay{Publisher: b, Limit: limit}
	keys := make(chan string, 10)
	h := sdk.HandlerFunc(func(ctx context.Context, d sdk.Delivery) error {
		keys <- d.Message().IdempotencyKey
		return nil
	})
	w, err := sdk.NewWorker(b, h, sdk.WorkerOptions{Queue: "later", Logger: mqQuiet(),
		Middleware: []sdk.Middleware{ld.Middleware()}})
	if err != nil {
		t.Fatal(err)
	}
	runMQ(t, w)
	m := &sdk.Message{Type: "remind", Delay: limit,
		Headers: map[string]string{sdk.HeaderDueAt: time.Now().Add(100 * time.Millisecond).UTC().Format(time.RFC3339Nano)}}
	if err := b.Publish(context.Background(), "later", m); err != nil {
		t.Fatal(err)
	}
	select {
	case k := <-keys:
		if k != m.ID {
			t.Errorf("the job ran with idempotency key %q, want the first message's ID %q", k, m.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the job never ran")
	}
}

// TestLongDelayHopNotice: the middleware sets WithHopNotice's notice when
// it hops a delivery, not when it runs the handler (no due header, or a
// due time passed) nor when the hop's publish fails (the delivery is then
// retried).
func TestLongDelayHopNotice(t *testing.T) {
	b := newMem(t)
	ran := false
	h := sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { ran = true; return nil })
	var failing failingPublisher
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano)
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339Nano)
	for _, c := range []struct {
		name        string
		due         string
		pub         sdk.Publisher
		hopped, err bool
	}{
		{"hop", future, b, true, false},
		{"no header", "", b, false, false},
		{"due passed", past, b, false, false},
		{"hop publish failed", future, failing, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ran = false
			m := &sdk.Message{ID: sdk.NewID(), Type: "remind"}
			if c.due != "" {
				m.SetHeader(sdk.HeaderDueAt, c.due)
			}
			ctx, hopped := sdk.WithHopNotice(context.Background())
			err := sdk.LongDelay{Publisher: c.pub, Limit: time.Minute}.Middleware()(h).Handle(ctx, berthtest.NewDelivery(m, berthtest.Queue("later")))
			if hopped() != c.hopped || (err != nil) != c.err || ran != (!c.hopped && !c.err) {
				t.Errorf("hopped %v, err %v, handler ran %v; want hopped %v, error %v", hopped(), err, ran, c.hopped, c.err)
			}
		})
	}
}

// failingPublisher refuses every publish.
type failingPublisher struct{}

func (failingPublisher) Publish(context.Context, string, ...*sdk.Message) error {
	return errors.New("broker down")
}
