package memory_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func receiveOne(t *testing.T, b *memory.Broker, q string) sdk.Delivery {
	t.Helper()
	ds, err := b.Receive(ctxT(t), q, 1)
	if err != nil {
		t.Fatalf("Receive: %v", err)
	}
	return ds[0]
}

func TestNewOptions(t *testing.T) {
	if _, err := memory.New(memory.Options{Lease: -time.Second}); err == nil {
		t.Error("New with a negative Lease: no error")
	}
	if _, err := memory.New(memory.Options{MaxBacklog: -1}); err == nil {
		t.Error("New with a negative MaxBacklog: no error")
	}
	b := newBroker(t, memory.Options{MaxMessageSize: -1})
	// No size limit: a body well over the default 1 MiB is accepted.
	big := &sdk.Message{Body: make([]byte, 2*memory.DefaultMaxMessageSize)}
	if err := b.Publish(ctxT(t), "q", big); err != nil {
		t.Fatalf("Publish without a size limit: %v", err)
	}
	d := receiveOne(t, b, "q")
	if len(d.Message().Body) != len(big.Body) {
		t.Errorf("body of %d bytes, want %d", len(d.Message().Body), len(big.Body))
	}
}

func TestDefaultMessageSizeLimit(t *testing.T) {
	b := newBroker(t, memory.Options{})
	err := b.Publish(ctxT(t), "q", &sdk.Message{Body: make([]byte, memory.DefaultMaxMessageSize+1)})
	var tooLarge *sdk.MessageTooLargeError
	if !errors.As(err, &tooLarge) || tooLarge.Limit != memory.DefaultMaxMessageSize {
		t.Errorf("Publish over the default limit: %v, want MessageTooLargeError with Limit %d", err, memory.DefaultMaxMessageSize)
	}
}

func TestInvalidArguments(t *testing.T) {
	b := newBroker(t, memory.Options{})
	ctx := ctxT(t)
	const bad = "no spaces"
	if _, err := b.Receive(ctx, bad, 1); !errors.Is(err, sdk.ErrInvalidQueue) {
		t.Errorf("Receive: %v, want ErrInvalidQueue", err)
	}
	if err := b.DeclareQueue(ctx, bad); !errors.Is(err, sdk.ErrInvalidQueue) {
		t.Errorf("DeclareQueue: %v, want ErrInvalidQueue", err)
	}
	if _, err := b.Stats(ctx, bad); !errors.Is(err, sdk.ErrInvalidQueue) {
		t.Errorf("Stats: %v, want ErrInvalidQueue", err)
	}
	if _, err := b.ListDeadLetters(ctx, bad, 1); !errors.Is(err, sdk.ErrInvalidQueue) {
		t.Errorf("ListDeadLetters: %v, want ErrInvalidQueue", err)
	}
	if err := b.Publish(ctx, "q", &sdk.Message{Delay: sdk.MaxDelay + time.Second}); !errors.Is(err, sdk.ErrInvalidMessage) {
		t.Errorf("Publish with a delay over MaxDelay: %v, want ErrInvalidMessage", err)
	}
	if err := b.Publish(ctx, "q", &sdk.Message{}, nil); !errors.Is(err, sdk.ErrInvalidMessage) {
		t.Errorf("Publish of a nil message: %v, want ErrInvalidMessage", err)
	}
	if s, _ := b.Stats(ctx, "q"); s.Ready != 0 {
		t.Errorf("%d messages ready after failed publishes, want 0", s.Ready)
	}
}

func TestUnusedQueue(t *testing.T) {
	b := newBroker(t, memory.Options{})
	ctx := ctxT(t)
	if s, err := b.Stats(ctx, "never-used"); !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("Stats = %+v, %v; want ErrNotFound (the same on every broker)", s, err)
	}
	if ms, err := b.ListDeadLetters(ctx, "never-used", 10); err != nil || len(ms) != 0 {
		t.Errorf("ListDeadLetters = %d, %v; want none", len(ms), err)
	}
	if _, err := b.GetDeadLetter(ctx, "never-used", "x"); !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("GetDeadLetter: %v, want ErrNotFound", err)
	}
	if n, err := b.RedriveDeadLetters(ctx, "never-used", "x"); !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("RedriveDeadLetters(x) = %d, %v; want ErrNotFound", n, err)
	}
	if n, err := b.RedriveDeadLetters(ctx, "never-used"); err != nil || n != 0 {
		t.Errorf("RedriveDeadLetters(all) = %d, %v; want 0, nil", n, err)
	}
	if n, err := b.PurgeDeadLetters(ctx, "never-used"); err != nil || n != 0 {
		t.Errorf("PurgeDeadLetters = %d, %v; want 0, nil", n, err)
	}
}

func TestRedriveUnknownIDRedrivesNothing(t *testing.T) {
	b := newBroker(t, memory.Options{})
	ctx := ctxT(t)
	m := &sdk.Message{Body: []byte("x")}
	if err := b.Publish(ctx, "q", m); err != nil {
		t.Fatal(err)
	}
	if err := receiveOne(t, b, "q").DeadLetter(ctx, errors.New("boom")); err != nil {
		t.Fatal(err)
	}
	if n, err := b.RedriveDeadLetters(ctx, "q", m.ID, "unknown"); !errors.Is(err, sdk.ErrNotFound) || n != 0 {
		t.Errorf("RedriveDeadLetters with an unknown id = %d, %v; want 0, ErrNotFound", n, err)
	}
	if s, _ := b.Stats(ctx, "q"); s.DeadLettered != 1 || s.Ready != 0 {
		t.Errorf("after a failed redrive: %+v, want the dead letter still there", s)
	}
}

func TestMaxDeliveriesDisabled(t *testing.T) {
	const lease = 5 * time.Millisecond
	b := newBroker(t, memory.Options{Lease: lease, MaxDeliveries: -1})
	if err := b.Publish(ctxT(t), "q", &sdk.Message{}); err != nil {
		t.Fatal(err)
	}
	for attempt := 1; attempt <= memory.DefaultMaxDeliveries+2; attempt++ {
		d := receiveOne(t, b, "q") // never settled
		if d.Attempt() != attempt {
			t.Fatalf("Attempt() = %d, want %d", d.Attempt(), attempt)
		}
	}
}

func TestMaxDeliveriesCountsRetries(t *testing.T) {
	b := newBroker(t, memory.Options{MaxDeliveries: 2})
	ctx := ctxT(t)
	m := &sdk.Message{}
	if err := b.Publish(ctx, "q", m); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := receiveOne(t, b, "q").Retry(ctx, 0, errors.New("boom")); err != nil {
			t.Fatal(err)
		}
	}
	// The third delivery would pass the cap: it is dead-lettered at receive.
	rctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if ds, err := b.Receive(rctx, "q", 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Receive past the cap: %d deliveries, %v; want none", len(ds), err)
	}
	dead, err := b.GetDeadLetter(ctx, "q", m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if dead.Header(sdk.HeaderDeadLetterClass) != string(sdk.ClassPoison) || dead.Header(sdk.HeaderDeadLetterAttempts) != "2" {
		t.Errorf("dead letter headers %q, want class %s at attempt 2", dead.Headers, sdk.ClassPoison)
	}
}

func TestReceiveMaxBelowOne(t *testing.T) {
	b := newBroker(t, memory.Options{})
	if err := b.Publish(ctxT(t), "q", &sdk.Message{}, &sdk.Message{}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctxT(t), "q", 0)
	if err != nil || len(ds) != 1 {
		t.Errorf("Receive(max=0) = %d deliveries, %v; want 1", len(ds), err)
	}
}

func TestWaitingReceiverWokenByPublish(t *testing.T) {
	b := newBroker(t, memory.Options{})
	got := make(chan sdk.Delivery, 1)
	go func() {
		ds, err := b.Receive(t.Context(), "q", 1)
		if err == nil {
			got <- ds[0]
		}
		close(got)
	}()
	time.Sleep(20 * time.Millisecond) // let it wait
	m := &sdk.Message{}
	if err := b.Publish(ctxT(t), "q", m); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-got:
		if d == nil || d.Message().ID != m.ID {
			t.Fatalf("waiting Receive got %v, want %s", d, m.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiting Receive not woken by Publish")
	}
}

// A receiver waiting for a far deadline is woken when a nearer one appears.
func TestWaitingReceiverSeesEarlierRetry(t *testing.T) {
	b := newBroker(t, memory.Options{Lease: time.Hour})
	ctx := ctxT(t)
	far := &sdk.Message{Delay: time.Hour}
	near := &sdk.Message{}
	if err := b.Publish(ctx, "q", far, near); err != nil {
		t.Fatal(err)
	}
	d := receiveOne(t, b, "q") // near, leased for an hour
	got := make(chan sdk.Delivery, 1)
	go func() {
		ds, err := b.Receive(t.Context(), "q", 1) // waits for the hour-long deadlines
		if err == nil {
			got <- ds[0]
		}
		close(got)
	}()
	time.Sleep(20 * time.Millisecond)
	retried := time.Now()
	if err := d.Retry(ctx, 30*time.Millisecond, errors.New("boom")); err != nil {
		t.Fatal(err)
	}
	select {
	case d2 := <-got:
		if d2 == nil || d2.Message().ID != near.ID || d2.Attempt() != 2 {
			t.Fatalf("got %v, want %s attempt 2", d2, near.ID)
		}
		if el := time.Since(retried); el < 30*time.Millisecond {
			t.Errorf("retry delivered after %s, before its delay", el)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiting Receive did not see the nearer retry")
	}
}

func TestSettleAfterClose(t *testing.T) {
	b := newBroker(t, memory.Options{})
	ctx := ctxT(t)
	if err := b.Publish(ctx, "q", &sdk.Message{}); err != nil {
		t.Fatal(err)
	}
	d := receiveOne(t, b, "q")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Ack(ctx); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("Ack after Close: %v, want ErrClosed", err)
	}
	if err := d.ExtendLease(ctx, time.Second); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("ExtendLease after Close: %v, want ErrClosed", err)
	}
	if _, err := b.Stats(ctx, "q"); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("Stats after Close: %v, want ErrClosed", err)
	}
	if err := b.DeclareQueue(ctx, "q"); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("DeclareQueue after Close: %v, want ErrClosed", err)
	}
	if _, err := b.PurgeDeadLetters(ctx, "q"); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("PurgeDeadLetters after Close: %v, want ErrClosed", err)
	}
}

func TestExtendLeaseAfterSettle(t *testing.T) {
	b := newBroker(t, memory.Options{})
	ctx := ctxT(t)
	if err := b.Publish(ctx, "q", &sdk.Message{}); err != nil {
		t.Fatal(err)
	}
	d := receiveOne(t, b, "q")
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.ExtendLease(ctx, time.Second); !errors.Is(err, sdk.ErrAlreadySettled) {
		t.Errorf("ExtendLease after Ack: %v, want ErrAlreadySettled", err)
	}
}

// TestStress mixes every operation from many goroutines and checks that no
// message is lost or duplicated: each ends acked or dead-lettered once.
func TestStress(t *testing.T) {
	const (
		n         = 2000
		receivers = 8
	)
	b := newBroker(t, memory.Options{Lease: 50 * time.Millisecond, MaxDeliveries: 6})
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	ids := make(map[string]bool, n)
	for i := 0; i < n; i += 100 {
		batch := make([]*sdk.Message, 100)
		for j := range batch {
			batch[j] = &sdk.Message{Body: []byte(fmt.Sprint(i + j))}
			if j%10 == 0 {
				batch[j].Delay = time.Duration(j) * time.Millisecond
			}
		}
		if err := b.Publish(ctx, "q", batch...); err != nil {
			t.Fatal(err)
		}
		for _, m := range batch {
			ids[m.ID] = true
		}
	}
	var (
		mu    sync.Mutex
		acked = map[string]int{}
		wg    sync.WaitGroup
	)
	for r := range receivers {
		rng := rand.New(rand.NewPCG(uint64(r), 1))
		wg.Go(func() {
			for ctx.Err() == nil {
				ds, err := b.Receive(ctx, "q", 1+rng.IntN(8))
				if err != nil {
					return
				}
				for _, d := range ds {
					var err error
					switch p := rng.IntN(100); {
					case p < 60:
						if err = d.Ack(ctx); err == nil {
							mu.Lock()
							acked[d.Message().ID]++
							mu.Unlock()
						}
					case p < 75:
						err = d.Retry(ctx, time.Duration(rng.IntN(5))*time.Millisecond, errors.New("flaky"))
					case p < 85:
						err = d.(sdk.Releaser).Release(ctx, 0)
					case p < 90:
						err = d.ExtendLease(ctx, time.Second)
						if err == nil {
							err = d.Ack(ctx)
							if err == nil {
								mu.Lock()
								acked[d.Message().ID]++
								mu.Unlock()
							}
						}
					case p < 93:
						err = d.DeadLetter(ctx, sdk.Permanent(errors.New("bad")))
					default:
						// abandoned: comes back after the lease, or goes to the DLQ at the cap
					}
					if err != nil && !errors.Is(err, sdk.ErrLeaseLost) {
						t.Errorf("settlement: %v", err)
					}
				}
			}
		})
	}
	// Wait until every message is acked or dead.
	for {
		s, err := b.Stats(ctx, "q")
		if err != nil {
			t.Fatal(err)
		}
		if s.Ready == 0 && s.Delayed == 0 && s.InFlight == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("not drained: %+v", s)
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	wg.Wait()
	dead, err := b.ListDeadLetters(context.Background(), "q", len(ids))
	if err != nil {
		t.Fatal(err)
	}
	deadIDs := map[string]int{}
	for _, m := range dead {
		deadIDs[m.ID]++
	}
	for id := range ids {
		if acked[id]+deadIDs[id] != 1 {
			t.Errorf("message %s: acked %d, dead %d; want exactly one", id, acked[id], deadIDs[id])
		}
	}
	t.Logf("%d messages: %d acked, %d dead-lettered", n, len(acked), len(dead))
}

// A receiver waiting for a far lease end is woken when ExtendLease moves
// that end nearer: the message comes back at the shortened lease, not at the
// old one.
func TestWaitingReceiverSeesShortenedLease(t *testing.T) {
	b := newBroker(t, memory.Options{Lease: time.Hour})
	ctx := ctxT(t)
	m := &sdk.Message{}
	if err := b.Publish(ctx, "q", m); err != nil {
		t.Fatal(err)
	}
	d := receiveOne(t, b, "q") // leased for an hour
	got := make(chan sdk.Delivery, 1)
	go func() {
		ds, err := b.Receive(t.Context(), "q", 1) // waits for the hour-long lease
		if err == nil {
			got <- ds[0]
		}
		close(got)
	}()
	time.Sleep(20 * time.Millisecond)
	if err := d.ExtendLease(ctx, 30*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	select {
	case d2 := <-got:
		if d2 == nil || d2.Message().ID != m.ID || d2.Attempt() != 2 {
			t.Fatalf("got %v, want %s attempt 2", d2, m.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiting Receive did not see the shortened lease")
	}
}

// OldestAge is the age of the oldest ready message even when a delayed
// message became due before a later publish but nobody looked at the queue
// in between.
func TestOldestAgeCountsLazilyPromoted(t *testing.T) {
	b := newBroker(t, memory.Options{})
	ctx := ctxT(t)
	if err := b.Publish(ctx, "q", &sdk.Message{Delay: 10 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // due for 190ms, not yet promoted
	if err := b.Publish(ctx, "q", &sdk.Message{}); err != nil {
		t.Fatal(err)
	}
	s, err := b.Stats(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	if s.Ready != 2 || s.OldestAge < 150*time.Millisecond {
		t.Errorf("Stats = %+v, want 2 ready, the oldest ready for at least 150ms", s)
	}
}

// A message whose last allowed lease ran out is a dead letter for
// RedriveDeadLetters too, not only for ListDeadLetters.
func TestRedriveSeesExpiredPoison(t *testing.T) {
	b := newBroker(t, memory.Options{Lease: 20 * time.Millisecond, MaxDeliveries: 1})
	ctx := ctxT(t)
	m := &sdk.Message{}
	if err := b.Publish(ctx, "q", m); err != nil {
		t.Fatal(err)
	}
	_ = receiveOne(t, b, "q") // never settled
	time.Sleep(60 * time.Millisecond)
	n, err := b.RedriveDeadLetters(ctx, "q")
	if err != nil || n != 1 {
		t.Fatalf("RedriveDeadLetters = %d, %v; want 1, nil", n, err)
	}
	d := receiveOne(t, b, "q")
	if d.Message().ID != m.ID || d.Attempt() != 1 {
		t.Errorf("got %s attempt %d, want %s attempt 1", d.Message().ID, d.Attempt(), m.ID)
	}
}

// Receive on a closed broker says so, whatever the queue name.
func TestReceiveAfterCloseInvalidName(t *testing.T) {
	b := newBroker(t, memory.Options{})
	_ = b.Close()
	if _, err := b.Receive(ctxT(t), "no spaces", 1); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("Receive after Close: %v, want ErrClosed", err)
	}
}

// Issue 18 defect 4: Publish with a context already cancelled stores
// nothing and returns context.Canceled, as RabbitMQ, SQS and PostgreSQL do.
func TestContract18_4_PublishCancelledContext(t *testing.T) {
	b := newBroker(t, memory.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Publish(ctx, "q", &sdk.Message{Body: []byte("x")}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Publish with a cancelled context = %v, want context.Canceled", err)
	}
	s, err := b.Stats(ctxT(t), "q")
	if err != nil && !errors.Is(err, sdk.ErrNotFound) { // not found: the queue was not even created
		t.Fatal(err)
	}
	if s.Ready+s.Delayed+s.InFlight != 0 {
		t.Errorf("a cancelled Publish stored a message: %+v", s)
	}
}

// Issue 11 item 2: a dead letter that carries a forged berth-dlq-queue goes
// back to the queue whose dead letter it is, not to the queue it names.
func TestHardening2_RedriveIgnoresForgedQueueHeader(t *testing.T) {
	b := newBroker(t, memory.Options{})
	ctx := ctxT(t)
	forged := &sdk.Message{ID: "forged-1", Headers: map[string]string{
		sdk.HeaderDeadLetterQueue: "victim", sdk.HeaderDeadLetterReason: "x"}}
	memory.PlantDeadLetter(b, "orders", forged)
	if n, err := b.RedriveDeadLetters(ctx, "orders"); err != nil || n != 1 {
		t.Fatalf("RedriveDeadLetters = %d, %v; want 1, nil", n, err)
	}
	if s, err := b.Stats(ctx, "victim"); (err != nil && !errors.Is(err, sdk.ErrNotFound)) || s.Ready != 0 { // never used: not found
		t.Errorf("the forged target got messages: %+v, %v", s, err)
	}
	d := receiveOne(t, b, "orders")
	if d.Message().ID != forged.ID || d.Message().Header(sdk.HeaderDeadLetterQueue) != "" {
		t.Errorf("redriven %s with headers %v, want %s without dead-letter headers", d.Message().ID, d.Message().Headers, forged.ID)
	}
	// And the application can no longer forge one at publish.
	err := b.Publish(ctx, "orders", &sdk.Message{Headers: map[string]string{sdk.HeaderDeadLetterQueue: "victim"}})
	if !errors.Is(err, sdk.ErrInvalidMessage) {
		t.Errorf("Publish with a berth- header = %v, want ErrInvalidMessage", err)
	}
}

// A dead letter planted as it is (PlantDeadLetter) is paged like any
// other, to the end of the queue and to a mark: it has a position.
func TestPlantedDeadLetterIsPaged(t *testing.T) {
	b := newBroker(t, memory.Options{})
	ctx := ctxT(t)
	if err := b.Publish(ctx, "orders", &sdk.Message{ID: "real-1"}); err != nil {
		t.Fatal(err)
	}
	if err := receiveOne(t, b, "orders").DeadLetter(ctx, sdk.Permanent(errors.New("bad"))); err != nil {
		t.Fatal(err)
	}
	memory.PlantDeadLetter(b, "orders", &sdk.Message{ID: "planted-1"})
	want := "[real-1 planted-1]"
	ids := func(ms []*sdk.Message) string {
		var out []string
		for _, m := range ms {
			out = append(out, m.ID)
		}
		return fmt.Sprint(out)
	}
	if ms, next, err := b.DeadLetterPage(ctx, "orders", "", 10); err != nil || ids(ms) != want || next != "" {
		t.Errorf("DeadLetterPage = %s %q %v, want %s", ids(ms), next, err, want)
	}
	mark, err := b.DeadLetterMark(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if ms, next, err := b.DeadLetterPageTo(ctx, "orders", "", mark, 10); err != nil || ids(ms) != want || next != "" {
		t.Errorf("DeadLetterPageTo(mark %q) = %s %q %v, want %s", mark, ids(ms), next, err, want)
	}
}

// After Close every call but Close returns ErrClosed, as the Broker's doc
// says, also those whose arguments name nothing to do (no message, no id,
// the empty mark): a walk to an empty mark on a closed broker is not told
// that there is nothing to walk.
func TestEveryCallAfterCloseIsErrClosed(t *testing.T) {
	b := newBroker(t, memory.Options{})
	ctx := ctxT(t)
	if err := b.Publish(ctx, "q", &sdk.Message{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	calls := []struct {
		name string
		call func() error
	}{
		{"Publish of no message", func() error { return b.Publish(ctx, "q") }},
		{"Queues", func() error { _, err := b.Queues(ctx); return err }},
		{"ListDeadLetters", func() error { _, err := b.ListDeadLetters(ctx, "q", 0); return err }},
		{"GetDeadLetter", func() error { _, err := b.GetDeadLetter(ctx, "q", "x"); return err }},
		{"RedriveDeadLetters", func() error { _, err := b.RedriveDeadLetters(ctx, "q"); return err }},
		{"DeleteDeadLetters of no id", func() error { _, err := b.DeleteDeadLetters(ctx, "q"); return err }},
		{"DeadLetterPage", func() error { _, _, err := b.DeadLetterPage(ctx, "q", "", 0); return err }},
		{"DeadLetterMark", func() error { _, err := b.DeadLetterMark(ctx, "q"); return err }},
		{"DeadLetterPageTo", func() error { _, _, err := b.DeadLetterPageTo(ctx, "q", "", "1", 0); return err }},
		{"DeadLetterPageTo the empty mark", func() error { _, _, err := b.DeadLetterPageTo(ctx, "q", "", "", 0); return err }},
		{"DeadLetterPageTo a bad mark", func() error { _, _, err := b.DeadLetterPageTo(ctx, "q", "", "x", 0); return err }},
	}
	for _, c := range calls {
		if err := c.call(); !errors.Is(err, sdk.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", c.name, err)
		}
	}
}

// TestEmptyPublishCreatesNoQueue: a Publish of no message validates the
// queue name and stores nothing, as on PostgreSQL (no row, so Stats finds
// no queue) and RabbitMQ (nothing declared): the queue does not come into
// being, and Stats of it still wraps ErrNotFound. A Publish of a message
// does create it.
func TestEmptyPublishCreatesNoQueue(t *testing.T) {
	b := newBroker(t, memory.Options{})
	ctx := ctxT(t)
	if err := b.Publish(ctx, "empty"); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, "bad name!"); err == nil {
		t.Fatal("an empty Publish to an invalid queue name succeeded")
	}
	if s, err := b.Stats(ctx, "empty"); !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("Stats after an empty Publish = %+v, %v; want ErrNotFound", s, err)
	}
	if qs, err := b.Queues(ctx); err != nil || len(qs) != 0 {
		t.Fatalf("Queues after an empty Publish = %v, %v; want none", qs, err)
	}
	if err := b.Publish(ctx, "empty", &sdk.Message{Type: "job"}); err != nil {
		t.Fatal(err)
	}
	if s, err := b.Stats(ctx, "empty"); err != nil || s.Ready != 1 {
		t.Fatalf("Stats after a Publish = %+v, %v; want one ready", s, err)
	}
}

// TestHeapsShrinkAfterBurst: a burst of delayed or leased messages must not
// keep its heaps' arrays for the life of the queue once they are gone.
func TestHeapsShrinkAfterBurst(t *testing.T) {
	ctx := ctxT(t)
	b, _ := memory.New(memory.Options{})
	defer b.Close()
	const burst = 20000
	msgs := make([]*sdk.Message, burst)
	for i := range msgs {
		msgs[i] = &sdk.Message{Delay: time.Millisecond}
	}
	if err := b.Publish(ctx, "q", msgs...); err != nil {
		t.Fatal(err)
	}
	if d, _ := memory.HeapCaps(b, "q"); d < burst {
		t.Fatalf("delayed heap capacity %d with %d delayed", d, burst)
	}
	var ds []sdk.Delivery
	for len(ds) < burst {
		got, err := b.Receive(ctx, "q", burst)
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, got...)
	}
	if d, _ := memory.HeapCaps(b, "q"); d > 4096 {
		t.Errorf("delayed heap capacity %d after its %d messages left", d, burst)
	}
	// Keep one in flight: the heap is not empty, only small.
	for _, d := range ds[1:] {
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, f := memory.HeapCaps(b, "q"); f > 4096 {
		t.Errorf("in-flight heap capacity %d with 1 in flight", f)
	}
}

// TestDeadLettersReleasedWhenDeleted: once every dead letter of a burst
// is deleted or redriven by id, the dead-letter list and its page-cursor
// map must not keep their burst-sized memory.
func TestDeadLettersReleasedWhenDeleted(t *testing.T) {
	ctx := ctxT(t)
	const burst = 100000
	for _, redrive := range []bool{false, true} {
		b, _ := memory.New(memory.Options{})
		if err := b.DeclareQueue(ctx, "q"); err != nil {
			t.Fatal(err)
		}
		ids := make([]string, burst)
		for i := range ids {
			ids[i] = fmt.Sprint(i)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		var m sdk.Message
		for _, id := range ids {
			m.ID = id
			memory.PlantDeadLetter(b, "q", &m)
		}
		var err error
		if redrive {
			_, err = b.RedriveDeadLetters(ctx, "q", ids...)
			for n := 0; err == nil && n < burst; { // take and ack them all
				var ds []sdk.Delivery
				ds, err = b.Receive(ctx, "q", burst)
				for _, d := range ds {
					_ = d.Ack(ctx)
				}
				n += len(ds)
			}
		} else {
			_, err = b.DeleteDeadLetters(ctx, "q", ids...)
		}
		if err != nil {
			t.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		// The list and the cursor map take some 30 bytes a letter.
		kept := int64(after.HeapAlloc) - int64(before.HeapAlloc)
		if limit := int64(burst) * 5; kept > limit {
			t.Errorf("redrive %v: %d bytes kept after all %d dead letters went, want at most %d", redrive, kept, burst, limit)
		}
		runtime.KeepAlive(b)
		runtime.KeepAlive(ids)
		b.Close()
	}
}

// TestReadyBufferShrinksAfterBurst: a queue that never empties again after
// a burst must not keep the burst's ready buffer.
func TestReadyBufferShrinksAfterBurst(t *testing.T) {
	ctx := ctxT(t)
	b, _ := memory.New(memory.Options{})
	defer b.Close()
	const burst = 20000
	msgs := make([]*sdk.Message, burst)
	for i := range msgs {
		msgs[i] = &sdk.Message{}
	}
	if err := b.Publish(ctx, "q", msgs...); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Receive(ctx, "q", burst-10); err != nil {
		t.Fatal(err)
	}
	if c := memory.ReadyCap(b, "q"); c > 4096 {
		t.Errorf("ready buffer of %d with 10 ready", c)
	}
	ds, err := b.Receive(ctx, "q", burst) // the rest, in order
	if err != nil || len(ds) != 10 || ds[0].Message().ID != msgs[burst-10].ID || ds[9].Message().ID != msgs[burst-1].ID {
		t.Fatalf("last 10: %d deliveries, %v", len(ds), err)
	}
}
