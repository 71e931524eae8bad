package rabbitmq

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// deadLetterN publishes n messages to q and dead-letters them in order; it
// returns their IDs, oldest first.
func deadLetterN(t *testing.T, ctx context.Context, b *Broker, q string, n int) []string {
	t.Helper()
	msgs := make([]*sdk.Message, n)
	for i := range msgs {
		msgs[i] = &sdk.Message{Type: "walk", Body: fmt.Appendf(nil, "body %d", i)}
	}
	if err := b.Publish(ctx, q, msgs...); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for len(ids) < n {
		ds, err := b.Receive(ctx, q, n-len(ids))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			if err := d.DeadLetter(ctx, sdk.Permanent(errors.New("bad"))); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, d.Message().ID)
		}
	}
	for i, m := range msgs {
		if ids[i] != m.ID {
			t.Fatalf("dead-lettered out of order: %d is %s, want %s", i, ids[i], m.ID)
		}
	}
	return ids
}

// rawDeadLetters reads q's whole dead-letter queue with a connection of its
// own and returns the deliveries in order; closing its channel returns them
// (the test no longer needs them in place).
func rawDeadLetters(t *testing.T, url, q string) []amqp.Delivery {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close() // returns the deliveries read
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(DeadLetterQueue(q), false)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// checkIntact fails unless q's dead-letter queue holds exactly ids, in
// that order, with no delivery counted, no walk stamp leaked, and their
// bodies and reasons as dead-lettered.
func checkIntact(t *testing.T, url, q string, ids []string) {
	t.Helper()
	got := rawDeadLetters(t, url, q)
	var gotIDs []string
	for _, d := range got {
		gotIDs = append(gotIDs, d.MessageId)
	}
	if !slices.Equal(gotIDs, ids) {
		t.Fatalf("dead-letter queue holds %d letters %v, want %d %v in order", len(gotIDs), gotIDs, len(ids), ids)
	}
	for i, d := range got {
		if n, _ := toInt(d.Headers["x-delivery-count"]); n > 1 {
			t.Errorf("dead letter %s: x-delivery-count %d, want at most 1 (this read)", d.MessageId, n)
		}
		if !bytes.Equal(d.Body, fmt.Appendf(nil, "body %d", i)) {
			t.Errorf("dead letter %s: body %q changed", d.MessageId, d.Body)
		}
		if r, _ := d.Headers[sdk.HeaderDeadLetterReason].(string); r != "permanent: bad" {
			t.Errorf("dead letter %s: reason %q, want the one it was dead-lettered with", d.MessageId, r)
		}
	}
}

// TestHardening4_DeadLetterWalkBoundsMemory: listing and showing dead
// letters hold one page at a time, however many the queue holds, and leave
// the queue as it was. Before, every call read the whole dead-letter queue
// (messages of up to 16 MiB) into memory: showing the last of 35 held 35.
func TestHardening4_DeadLetterWalkBoundsMemory(t *testing.T) {
	url, q, b := brokerOnQueue(t, Options{Logger: quiet})
	b.walkTune.page = 8
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	ids := deadLetterN(t, ctx, b, q, 35)

	m, err := b.GetDeadLetter(ctx, q, ids[34])
	if err != nil || m.ID != ids[34] || string(m.Body) != "body 34" {
		t.Fatalf("GetDeadLetter(last): %v, %v", m, err)
	}
	if _, ok := m.Headers[walkStampHeader]; ok {
		t.Error("the walk's stamp leaked into a dead letter shown")
	}
	if _, err := b.GetDeadLetter(ctx, q, "no-such-id"); !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("GetDeadLetter(unknown): %v, want sdk.ErrNotFound", err)
	}
	l, err := b.ListDeadLetters(ctx, q, 12)
	if err != nil || len(l) != 12 {
		t.Fatalf("ListDeadLetters(12): %d, %v", len(l), err)
	}
	for i, m := range l {
		if m.ID != ids[i] {
			t.Fatalf("listing %d: %s, want %s (oldest first)", i, m.ID, ids[i])
		}
	}
	if peak := b.walkTune.peak.Load(); peak > 8 || peak == 0 {
		t.Errorf("a walk held %d dead letters at once, want 1..8 (the page)", peak)
	}

	// A page also ends at its byte bound: one letter at a time.
	b.walkTune.page, b.walkTune.bytes = 100, 1
	b.walkTune.peak.Store(0)
	if l, err := b.ListDeadLetters(ctx, q, 100); err != nil || len(l) != 35 {
		t.Fatalf("ListDeadLetters(100): %d, %v", len(l), err)
	}
	if peak := b.walkTune.peak.Load(); peak != 1 {
		t.Errorf("with a 1-byte page bound a walk held %d dead letters at once, want 1", peak)
	}
	checkIntact(t, url, q, ids)
}

// TestHardening4_RedriveManyPages: redriving more dead letters than a page
// holds puts every one back on its queue once, none doubled, none left, and
// redriving chosen IDs spread over pages takes exactly those.
func TestHardening4_RedriveManyPages(t *testing.T) {
	_, q, b := brokerOnQueue(t, Options{Logger: quiet})
	b.walkTune.page = 7
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	ids := deadLetterN(t, ctx, b, q, 50)

	chosen := []string{ids[1], ids[9], ids[23], ids[48]}
	if _, err := b.RedriveDeadLetters(ctx, q, ids[3], "no-such-id"); !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("redrive with an unknown ID: %v, want sdk.ErrNotFound", err)
	}
	n, err := b.RedriveDeadLetters(ctx, q, chosen...)
	if err != nil || n != len(chosen) {
		t.Fatalf("redrive of %d chosen: %d, %v", len(chosen), n, err)
	}
	rest := slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return slices.Contains(chosen, id) })
	n, err = b.RedriveDeadLetters(ctx, q)
	if err != nil || n != len(rest) {
		t.Fatalf("redrive of all: %d, %v; want %d", n, err, len(rest))
	}
	if peak := b.walkTune.peak.Load(); peak > 7 {
		t.Errorf("a walk held %d dead letters at once, want at most 7", peak)
	}
	if info, err := b.Info(ctx, q); err != nil || info.DeadLettered != 0 {
		t.Fatalf("after redrive: %+v, %v; want no dead letter left", info, err)
	}
	seen := map[string]int{}
	for len(seen) < len(ids) {
		ds, err := b.Receive(ctx, q, len(ids))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			seen[d.Message().ID]++
			if got := d.Message().Header(sdk.HeaderRedriveCount); got != "1" {
				t.Errorf("%s: redrive count %q, want 1", d.Message().ID, got)
			}
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Errorf("dead letter %s came back %d times, want once", id, seen[id])
		}
	}
	if len(seen) != len(ids) {
		t.Errorf("%d distinct messages came back, want %d", len(seen), len(ids))
	}
	// None doubled: nothing more arrives.
	short, stop := context.WithTimeout(ctx, 500*time.Millisecond)
	defer stop()
	if ds, err := b.Receive(short, q, 1); len(ds) > 0 {
		t.Errorf("an extra copy of %s came back (%v)", ds[0].Message().ID, err)
	}
}

// TestHardening4_DeleteDeadLetters: chosen dead letters are deleted across
// pages, the others stay in order; an unknown ID deletes nothing.
func TestHardening4_DeleteDeadLetters(t *testing.T) {
	_, q, b := brokerOnQueue(t, Options{Logger: quiet})
	b.walkTune.page = 4
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	ids := deadLetterN(t, ctx, b, q, 12)
	if n, err := b.DeleteDeadLetters(ctx, q, ids[0], "no-such-id"); !errors.Is(err, sdk.ErrNotFound) || n != 0 {
		t.Fatalf("delete with an unknown ID: %d, %v; want 0 and sdk.ErrNotFound", n, err)
	}
	n, err := b.DeleteDeadLetters(ctx, q, ids[0], ids[5], ids[11])
	if err != nil || n != 3 {
		t.Fatalf("delete of 3: %d, %v", n, err)
	}
	l, err := b.ListDeadLetters(ctx, q, 100)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range l {
		got = append(got, m.ID)
	}
	want := []string{ids[1], ids[2], ids[3], ids[4], ids[6], ids[7], ids[8], ids[9], ids[10]}
	if !slices.Equal(got, want) {
		t.Fatalf("after delete: %v, want %v", got, want)
	}
}

// TestHardening4_WalkMeetsItsOwnCopies: a walk that meets a letter it kept
// before it has looked at every letter the queue held (another walk took
// some from under it) stops and says so with a *ScanError rather than
// listing letters twice; nothing is lost.
func TestHardening4_WalkMeetsItsOwnCopies(t *testing.T) {
	url, q, b := brokerOnQueue(t, Options{Logger: quiet})
	b.walkTune.page = 2
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	ids := deadLetterN(t, ctx, b, q, 6)

	// Another reader holds the last two letters unacknowledged while the
	// walk runs: the walk counted 6 but can reach only 4, then meets its
	// own copies.
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	other, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	var held []uint64
	b.walkTune.afterCount = func() {
		// After the walk counted the queue, before its first get: take
		// the first two, which the walk then never sees.
		for range 2 {
			d, ok, err := other.Get(DeadLetterQueue(q), false)
			if err != nil || !ok {
				t.Errorf("other reader: %v %v", ok, err)
				return
			}
			held = append(held, d.DeliveryTag)
		}
	}
	l, err := b.ListDeadLetters(ctx, q, 100)
	var se *ScanError
	if !errors.As(err, &se) || !errors.Is(err, ErrScanIncomplete) || se.Remaining != 2 {
		t.Fatalf("ListDeadLetters under another reader: %d letters, %v; want a *ScanError with 2 remaining", len(l), err)
	}
	if len(l) != 4 || l[0].ID != ids[2] || l[3].ID != ids[5] {
		t.Fatalf("listed %d letters, want the 4 the walk could reach, each once", len(l))
	}
	b.walkTune.afterCount = nil
	if err := other.Close(); err != nil { // the other reader gives its two back
		t.Fatal(err)
	}
	got := rawDeadLetters(t, url, q)
	var gotIDs []string
	for _, d := range got {
		gotIDs = append(gotIDs, d.MessageId)
	}
	slices.Sort(gotIDs)
	want := slices.Clone(ids)
	slices.Sort(want)
	if !slices.Equal(gotIDs, want) {
		t.Fatalf("after the interrupted walk the queue holds %v, want each of %v once", gotIDs, want)
	}
}

// TestContract18_5_QuorumDeadLetterQueueDeliveryLimit: on a quorum
// dead-letter queue declared with a small delivery limit (2), listing,
// showing and checking for redrive many more times than the limit leaves
// every dead letter present, intact, in order and with no delivery counted.
func TestContract18_5_QuorumDeadLetterQueueDeliveryLimit(t *testing.T) {
	url := serverURL(t)
	q := testQueue(t, url)
	decl := newBroker(t, url, Options{Logger: quiet})
	ch := ownChannel(t, url, false)
	if err := ch.ExchangeDeclare(DefaultDeadLetterExchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	dlqArgs := amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(2)}
	if _, err := ch.QueueDeclare(DeadLetterQueue(q), true, false, false, false, dlqArgs); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(DeadLetterQueue(q), q, DefaultDeadLetterExchange, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(q, true, false, false, false, decl.mainArgs(q)); err != nil {
		t.Fatal(err)
	}
	b := newBroker(t, url, Options{Logger: quiet, NoDeclare: true})
	b.walkTune.page = 2
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	ids := deadLetterN(t, ctx, b, q, 5)
	for i := range 8 {
		l, err := b.ListDeadLetters(ctx, q, 3)
		if err != nil || len(l) != 3 || l[0].ID != ids[0] || l[2].ID != ids[2] {
			t.Fatalf("listing %d: %d letters, %v; want the first three in order", i, len(l), err)
		}
		if _, err := b.GetDeadLetter(ctx, q, ids[4]); err != nil {
			t.Fatalf("show %d: %v", i, err)
		}
		if _, err := b.RedriveDeadLetters(ctx, q, ids[1], "no-such-id"); !errors.Is(err, sdk.ErrNotFound) {
			t.Fatalf("redrive check %d: %v, want sdk.ErrNotFound", i, err)
		}
	}
	checkIntact(t, url, q, ids)
}

// queueIDs reads all of queue with a connection of its own and returns the
// message IDs in it, once it holds want messages or after a few seconds
// (a closed channel's letters go back to their queue asynchronously);
// closing the connection returns the messages read.
func queueIDs(t *testing.T, url, queue string, want int) []string {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		qi, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if qi.Messages == want || time.Now().After(deadline) {
			break
		}
	}
	var ids []string
	for {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return ids
		}
		ids = append(ids, d.MessageId)
	}
}

// TestReview_RedriveCutShortReportsFailures: a redrive that an error ends
// part-way (here the operator's ctx, cancelled during the third page)
// reports, with that error, both what it moved and the redrives that had
// failed before it (the first page's: its queue was deleted under it), as
// berth and the dashboard call it (dlq.Apply); the report matches the
// queues afterwards, nothing lost, nothing doubled. Before, the failures
// were reported only when the walk ended cleanly: this one said 10 moved
// and nothing missed, leaving 5 failed redrives unmentioned.
func TestReview_RedriveCutShortReportsFailures(t *testing.T) {
	url, q, b1 := brokerOnQueue(t, Options{Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	ids := deadLetterN(t, ctx, b1, q, 20)
	_ = b1.Close() // its consumer would declare q again once it is deleted
	b := newBroker(t, url, Options{Logger: quiet, NoDeclare: true})
	admin := ownChannel(t, url, false)

	b.walkTune.afterCount = func() {
		// The first page's redrives find no queue (unroutable).
		if _, err := admin.QueueDelete(q, false, false, false); err != nil {
			t.Error(err)
		}
	}
	actx, stop := context.WithCancel(ctx)
	defer stop()
	r, err := dlq.Apply(actx, b, q, dlq.Filter{}, dlq.Redrive, dlq.Options{PageSize: 5}, func(done int) {
		switch done { // called as the sweep takes each next page
		case 5: // the queue is back: the second page's redrives succeed
			if _, err := admin.QueueDeclare(q, true, false, false, false, b.mainArgs(q)); err != nil {
				t.Error(err)
			}
		case 10: // the operator interrupts: this page is finished, then the sweep ends
			stop()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Apply: %+v, %v; want context.Canceled", r, err)
	}
	if strings.Contains(err.Error(), "publish failed") {
		t.Errorf("Apply's error %q repeats the failures it reports in Failed", err)
	}
	var failed []string
	for _, f := range r.Failed {
		failed = append(failed, f.ID)
		if !errors.Is(f.Err, sdk.ErrNotFound) {
			t.Errorf("failure of %s: %v, want the unroutable redrive (sdk.ErrNotFound)", f.ID, f.Err)
		}
	}
	slices.Sort(failed)
	wantFailed := slices.Sorted(slices.Values(ids[:5]))
	if r.Done != 10 || r.Missed != 5 || !slices.Equal(failed, wantFailed) {
		t.Fatalf("Apply reported %d done, %d missed, failed %v; want 10 done and the first page's 5 failed %v",
			r.Done, r.Missed, failed, wantFailed)
	}

	// The queues hold what the report says: the 10 redriven on q, the 5
	// failed and the 5 never reached still dead letters, each once.
	onQueue := queueIDs(t, url, q, 10)
	dead := queueIDs(t, url, DeadLetterQueue(q), 10)
	slices.Sort(onQueue)
	slices.Sort(dead)
	if want := slices.Sorted(slices.Values(ids[5:15])); !slices.Equal(onQueue, want) {
		t.Errorf("queue holds %v, want the 10 redriven %v", onQueue, want)
	}
	if want := slices.Sorted(slices.Values(append(slices.Clone(ids[:5]), ids[15:]...))); !slices.Equal(dead, want) {
		t.Errorf("dead-letter queue holds %v, want the 5 failed and the 5 not reached %v", dead, want)
	}
}
