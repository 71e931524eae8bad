package jetstream_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// testOpts are the options of this file's brokers.
var testOpts = jetstream.Options{AckWait: testLease, WaitTime: 700 * time.Millisecond, MaxDeliveries: testMaxDeliveries, Logger: quiet}

// TestQueueNamesDoNotCollide: queue names that differ only in '.' and '_'
// (which stream names cannot hold) get streams of their own.
func TestQueueNamesDoNotCollide(t *testing.T) {
	b := newBroker(t, testOpts)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	base := "names" + suffix()
	queues := []string{base + ".a_b", base + "_a.b", base + "_a_b", base + ".a.b", base + "__aDb", base + "_Da_b"}
	streams := map[string]string{}
	for _, q := range queues {
		s, dlq := b.StreamNames(q)
		for _, n := range []string{s, dlq} {
			if prev, dup := streams[n]; dup {
				t.Errorf("queues %q and %q share stream %s", prev, q, n)
			}
			streams[n] = q
		}
		if err := b.DeclareQueue(ctx, q); err != nil {
			t.Fatalf("DeclareQueue(%q): %v", q, err)
		}
		t.Cleanup(func() { _ = b.DeleteQueue(context.Background(), q) })
	}
	for _, q := range queues {
		if err := b.Publish(ctx, q, &sdk.Message{Type: "names", Body: []byte(q)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range queues {
		ds, err := b.Receive(ctx, q, 10)
		if err != nil || len(ds) != 1 || string(ds[0].Message().Body) != q {
			t.Fatalf("Receive(%q): %d deliveries, %v", q, len(ds), err)
		}
		if err := ds[0].Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCancelledReceiveGivesBack: a message that reaches a long poll whose
// Receive was cancelled is handed back without consuming an attempt.
func TestCancelledReceiveGivesBack(t *testing.T) {
	b := newBroker(t, jetstream.Options{AckWait: 5 * time.Second, WaitTime: 3 * time.Second, Logger: quiet})
	q := declare(t, b, "giveback")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	rctx, rcancel := context.WithCancel(ctx)
	errs := make(chan error, 1)
	go func() {
		ds, err := b.Receive(rctx, q, 1)
		if len(ds) > 0 {
			err = errors.New("a cancelled Receive returned deliveries")
		}
		errs <- err
	}()
	time.Sleep(300 * time.Millisecond) // the long poll is open on the server
	rcancel()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Receive: %v", err)
	}
	// Published while the cancelled pull request is still open: the server
	// hands it to that request, and the drain must give it back.
	m := &sdk.Message{Type: "giveback"}
	if err := b.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	var d sdk.Delivery
	for d == nil {
		ds, err := b.Receive(ctx, q, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) > 0 {
			d = ds[0]
		}
	}
	if d.Message().ID != m.ID || d.Attempt() != 1 {
		t.Fatalf("got %s attempt %d, want %s attempt 1 (well before its AckWait of 5 s)", d.Message().ID, d.Attempt(), m.ID)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRedriveIgnoresForgedQueueHeader: a dead letter goes back to the
// queue whose dead-letter stream holds it, whatever its berth-dlq-queue
// header says.
func TestRedriveIgnoresForgedQueueHeader(t *testing.T) {
	b := newBroker(t, testOpts)
	q, other := declare(t, b, "redrive"), declare(t, b, "victim")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.Publish(ctx, q, &sdk.Message{Type: "forged"}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive: %d, %v", len(ds), err)
	}
	// A handler cannot set berth- headers, but a raw producer can write
	// anything; here the header is forged in the stored dead letter itself
	// by dead-lettering from a message that carries it.
	ds[0].Message().Headers = map[string]string{sdk.HeaderDeadLetterQueue: other}
	if err := ds[0].DeadLetter(ctx, sdk.Permanent(errors.New("no"))); err != nil {
		t.Fatal(err)
	}
	if n, err := b.RedriveDeadLetters(ctx, q); err != nil || n != 1 {
		t.Fatalf("RedriveDeadLetters = %d, %v", n, err)
	}
	ds, err = b.Receive(ctx, q, 1)
	if err != nil || len(ds) != 1 || ds[0].Message().Type != "forged" {
		t.Fatalf("the redriven message is not back on %s: %d, %v", q, len(ds), err)
	}
	_ = ds[0].Ack(ctx)
	st, err := b.Stats(ctx, other)
	if err != nil || st.Ready != 0 {
		t.Errorf("queue %s named by the forged header: %+v, %v; want nothing", other, st, err)
	}
}

// TestForeignMessages: a message another producer publishes on the queue's
// subject, without berth's header, arrives with its Nats-Msg-Id as ID and
// its headers.
func TestForeignMessages(t *testing.T) {
	b := newBroker(t, testOpts)
	q := declare(t, b, "foreign")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	nc, err := nats.Connect(integration.NATSURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	m := nats.NewMsg(b.Subject(q))
	m.Header.Set(nats.MsgIdHdr, "order-7")
	m.Header.Set("X-Tenant", "acme")
	m.Data = []byte("raw")
	if err := nc.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1)
	for err == nil && len(ds) == 0 {
		ds, err = b.Receive(ctx, q, 1)
	}
	if err != nil {
		t.Fatal(err)
	}
	got := ds[0].Message()
	if got.ID != "order-7" || string(got.Body) != "raw" || got.Header("X-Tenant") != "acme" || ds[0].Attempt() != 1 {
		t.Errorf("foreign message = %+v attempt %d", got, ds[0].Attempt())
	}
	_ = ds[0].Ack(ctx)
}

// TestStatsCounts checks what Stats reports, the limit of CapStats aside:
// ready, delayed (publish delays), in flight, dead-lettered and the oldest
// ready message's age.
func TestStatsCounts(t *testing.T) {
	b := newBroker(t, testOpts)
	q := declare(t, b, "stats")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	delayed := &sdk.Message{Type: "later", Delay: 10 * time.Minute}
	if err := b.Publish(ctx, q, &sdk.Message{Type: "a"}, &sdk.Message{Type: "b"}, &sdk.Message{Type: "c"}, delayed); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	ds, err := b.Receive(ctx, q, 1) // also starts the mover, which holds the delayed one back
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive: %d, %v", len(ds), err)
	}
	if err := ds[0].DeadLetter(ctx, sdk.Permanent(errors.New("no"))); err != nil {
		t.Fatal(err)
	}
	held, err := b.Receive(ctx, q, 1)
	if err != nil || len(held) != 1 {
		t.Fatalf("Receive: %d, %v", len(held), err)
	}
	var st sdk.QueueStats
	for {
		st, err = b.Stats(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if st.Ready == 1 && st.Delayed == 1 && st.InFlight == 1 && st.DeadLettered == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("Stats %+v: want 1 ready, 1 delayed, 1 in flight, 1 dead-lettered", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st.OldestAge < 50*time.Millisecond || st.OldestAge > time.Minute {
		t.Errorf("OldestAge = %s", st.OldestAge)
	}
	_ = held[0].Ack(ctx)
	if _, err := b.Stats(ctx, "missing_"+suffix()); !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("Stats of a queue that does not exist: %v, want ErrNotFound", err)
	}
}

// TestDeadLetterPagesAndDelete walks the dead letters page by page while
// deleting some (the cursor stays valid), deletes by id, and lists queues.
func TestDeadLetterPagesAndDelete(t *testing.T) {
	b := newBroker(t, testOpts)
	q := declare(t, b, "pages.x")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const n = 7
	for range n {
		if err := b.Publish(ctx, q, &sdk.Message{Type: "page"}); err != nil {
			t.Fatal(err)
		}
	}
	var order []string
	for len(order) < n {
		ds, err := b.Receive(ctx, q, n)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			if err := d.DeadLetter(ctx, sdk.Permanent(errors.New("no"))); err != nil {
				t.Fatal(err)
			}
			order = append(order, d.Message().ID)
		}
	}
	var walked []string
	cursor := ""
	for page := 0; ; page++ {
		ms, next, err := b.DeadLetterPage(ctx, q, cursor, 3)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			walked = append(walked, m.ID)
		}
		if page == 0 { // delete what the first page passed: the cursor holds
			if k, err := b.DeleteDeadLetters(ctx, q, ms[0].ID, ms[1].ID); err != nil || k != 2 {
				t.Fatalf("DeleteDeadLetters = %d, %v", k, err)
			}
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if len(walked) != n {
		t.Fatalf("walked %d dead letters, want %d", len(walked), n)
	}
	// "Everything" (math.MaxInt) after a cursor: the rest, not an overflow.
	_, cursor, err := b.DeadLetterPage(ctx, q, "", 1)
	if err != nil || cursor == "" {
		t.Fatalf("first page: cursor %q, %v", cursor, err)
	}
	if rest, next, err := b.DeadLetterPage(ctx, q, cursor, math.MaxInt); err != nil || len(rest) != n-3 || next != "" {
		t.Fatalf("the rest with limit MaxInt: %d letters, cursor %q, %v; want %d, \"\", nil", len(rest), next, err, n-3)
	}
	for i := range order {
		if walked[i] != order[i] {
			t.Fatalf("walk order %v, want %v", walked, order)
		}
	}
	if _, err := b.DeleteDeadLetters(ctx, q, order[2], sdk.NewID()); !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("DeleteDeadLetters with an unknown id: %v, want ErrNotFound", err)
	}
	if ms, _ := b.ListDeadLetters(ctx, q, 0); len(ms) != n-2 {
		t.Errorf("%d dead letters left, want %d (a refused delete deletes nothing)", len(ms), n-2)
	}
	qs, err := b.Queues(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, name := range qs {
		found = found || name == q
	}
	if !found {
		t.Errorf("Queues() does not list %s", q)
	}
}
