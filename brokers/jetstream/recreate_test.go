package jetstream_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/sdk"
)

// recreateStream deletes one of queue's streams alone (an operator's
// `nats stream rm`), then declares the queue again through a new Broker,
// which it returns: the other stream keeps its messages and its dedupe
// window, while the recreated one numbers its messages from 1 again.
func recreateStream(ctx context.Context, t *testing.T, q, stream string) *jetstream.Broker {
	t.Helper()
	if err := rawJetStream(t).DeleteStream(ctx, stream); err != nil {
		t.Fatal(err)
	}
	b := newBroker(t, testOpts)
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	return b
}

// A queue stream deleted and created again numbers its messages from 1
// again, while the dead-letter stream keeps the Nats-Msg-Ids of the dead
// letters it stored within its Duplicates window. A dead letter's ID was
// derived from the queue stream's sequence alone, so the dead letter of a
// new message at an old one's sequence was dropped as a duplicate, and the
// message acked: the job was lost.
func TestDeadLetterAfterQueueStreamRecreated(t *testing.T) {
	b := newBroker(t, testOpts)
	q := declare(t, b, "recreateq")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	deadLetter := func(b *jetstream.Broker, id string) {
		t.Helper()
		if err := b.Publish(ctx, q, &sdk.Message{ID: id, Body: []byte(id)}); err != nil {
			t.Fatal(err)
		}
		if err := receiveOne(ctx, t, b, q).DeadLetter(ctx, sdk.Permanent(errors.New("bad"))); err != nil {
			t.Fatal(err)
		}
	}
	deadLetter(b, "before")
	stream, _ := b.StreamNames(q)
	b2 := recreateStream(ctx, t, q, stream)
	deadLetter(b2, "after") // stored at sequence 1 again
	dls, err := b2.ListDeadLetters(ctx, q, 10)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range dls {
		ids = append(ids, m.ID)
	}
	if len(ids) != 2 || ids[0] != "before" || ids[1] != "after" {
		t.Fatalf("dead letters %q, want [before after]", ids)
	}
}

// Likewise a dead-letter stream deleted and created again: the redriven
// copy's ID was derived from the dead letter's sequence alone, so the
// queue stream dropped the copy of a new letter at a redriven one's
// sequence as a duplicate, and the redrive deleted the letter and its held
// copy and counted it: the job was lost.
func TestRedriveAfterDeadLetterStreamRecreated(t *testing.T) {
	b := newBroker(t, testOpts)
	q := declare(t, b, "recreatedlq")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	redrive := func(b *jetstream.Broker, id string) {
		t.Helper()
		if err := b.Publish(ctx, q, &sdk.Message{ID: id, Body: []byte(id)}); err != nil {
			t.Fatal(err)
		}
		if err := receiveOne(ctx, t, b, q).DeadLetter(ctx, sdk.Permanent(errors.New("bad"))); err != nil {
			t.Fatal(err)
		}
		if n, err := b.RedriveDeadLetters(ctx, q); n != 1 || err != nil {
			t.Fatalf("RedriveDeadLetters = %d, %v; want 1", n, err)
		}
		d := receiveOne(ctx, t, b, q)
		if d.Message().ID != id {
			t.Fatalf("redriven %q, want %q", d.Message().ID, id)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	redrive(b, "before")
	_, dlq := b.StreamNames(q)
	b2 := recreateStream(ctx, t, q, dlq)
	redrive(b2, "after") // its dead letter is at sequence 1 again
}

// A foreign message without a Nats-Msg-Id is delivered with an ID made of
// its stream and sequence: after the stream was deleted and created again,
// a new message got the ID of an old one, and an idempotency key derived
// from the ID skipped the new job as done.
func TestForeignIDAfterQueueStreamRecreated(t *testing.T) {
	b := newBroker(t, testOpts)
	q := declare(t, b, "recreateid")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	take := func(b *jetstream.Broker, body string) string {
		t.Helper()
		publishRaw(t, b, q, nil, body)
		d := receiveOne(ctx, t, b, q)
		if string(d.Message().Body) != body {
			t.Fatalf("received %q, want %q", d.Message().Body, body)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		return d.Message().ID
	}
	first := take(b, "first")
	stream, _ := b.StreamNames(q)
	b2 := recreateStream(ctx, t, q, stream)
	if second := take(b2, "second"); second == first {
		t.Fatalf("two messages delivered as %q", first)
	}
}

// A dead-letter stream deleted (by an operator emptying it) after the
// Broker declared the queue: no stream answered the dead letter's publish,
// and as the Broker kept its declared entry, every DeadLetter, and the
// dead-lettering of every poison message, failed with ErrUnavailable until
// the Broker was replaced, the message delivered again for ever. As
// Publish does with the queue's stream, DeadLetter declares the queue
// again and stores the dead letter.
func TestDeadLetterAfterDeadLetterStreamDeleted(t *testing.T) {
	b := newBroker(t, testOpts)
	q := declare(t, b, "dlqdeleted")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.Publish(ctx, q, &sdk.Message{ID: "gone-dlq"}); err != nil {
		t.Fatal(err)
	}
	_, dlq := b.StreamNames(q)
	if err := rawJetStream(t).DeleteStream(ctx, dlq); err != nil {
		t.Fatal(err)
	}
	if err := receiveOne(ctx, t, b, q).DeadLetter(ctx, sdk.Permanent(errors.New("bad"))); err != nil {
		t.Fatalf("DeadLetter after the dead-letter stream was deleted: %v", err)
	}
	m, err := b.GetDeadLetter(ctx, q, "gone-dlq")
	if err != nil {
		t.Fatalf("GetDeadLetter: %v", err)
	}
	if m.ID != "gone-dlq" {
		t.Errorf("dead letter %q, want gone-dlq", m.ID)
	}
}

// Likewise the queue's stream deleted (its dead letters kept) after a
// Broker that does not receive from the queue (an operator's tool, which
// no pull tells of the deletion) declared it: every redrive failed with
// JetStream's "stream not found" until the Broker was replaced.
func TestRedriveAfterQueueStreamDeleted(t *testing.T) {
	b := newBroker(t, testOpts)
	q := declare(t, b, "qdeleted")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.Publish(ctx, q, &sdk.Message{ID: "gone-q"}); err != nil {
		t.Fatal(err)
	}
	if err := receiveOne(ctx, t, b, q).DeadLetter(ctx, sdk.Permanent(errors.New("bad"))); err != nil {
		t.Fatal(err)
	}
	admin := newBroker(t, testOpts) // declares the queue, never receives
	if err := admin.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	stream, _ := admin.StreamNames(q)
	if err := rawJetStream(t).DeleteStream(ctx, stream); err != nil {
		t.Fatal(err)
	}
	if n, err := admin.RedriveDeadLetters(ctx, q, "gone-q"); n != 1 || err != nil {
		t.Fatalf("RedriveDeadLetters after the queue's stream was deleted = %d, %v; want 1", n, err)
	}
	if d := receiveOne(ctx, t, b, q); d.Message().ID != "gone-q" {
		t.Errorf("redriven %q, want gone-q", d.Message().ID)
	}
}

// Stats of a queue whose ready consumer does not exist (deleted by an
// operator, or a declaration cut short after the stream): it returned
// zeros, hiding the stored backlog and every dead letter.
func TestStatsWithoutReadyConsumer(t *testing.T) {
	b := newBroker(t, testOpts)
	q := declare(t, b, "noconsumer")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.Publish(ctx, q, &sdk.Message{ID: "a"}, &sdk.Message{ID: "b"}, &sdk.Message{ID: "c", Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := receiveOne(ctx, t, b, q).DeadLetter(ctx, sdk.Permanent(errors.New("bad"))); err != nil {
		t.Fatal(err)
	}
	stream, _ := b.StreamNames(q)
	if err := rawJetStream(t).DeleteConsumer(ctx, stream, "berth"); err != nil {
		t.Fatal(err)
	}
	st, err := newBroker(t, testOpts).Stats(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready != 1 || st.Delayed != 1 || st.DeadLettered != 1 || st.OldestAge <= 0 {
		t.Errorf("Stats without the ready consumer = %+v; want Ready 1, Delayed 1, DeadLettered 1, an OldestAge", st)
	}
}

// The ready consumer deleted (by an operator, or expired by an
// inactive_threshold someone set) while no pull of the receiving Broker
// was waiting on it, so that no 409 told it: a pull on a consumer that
// does not exist gets no answer at all, and every Receive returned no
// deliveries and no error, for ever, while the stream held the jobs
// (Health ready, the queue stuck). A pull left unanswered has the queue
// declared again at the next Receive.
func TestReceiveAfterReadyConsumerDeleted(t *testing.T) {
	b := newBroker(t, testOpts)
	q := declare(t, b, "consumergone")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.Publish(ctx, q, &sdk.Message{ID: "first"}); err != nil {
		t.Fatal(err)
	}
	if err := receiveOne(ctx, t, b, q).Ack(ctx); err != nil {
		t.Fatal(err)
	}
	stream, _ := b.StreamNames(q)
	if err := rawJetStream(t).DeleteConsumer(ctx, stream, "berth"); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, q, &sdk.Message{ID: "stuck"}); err != nil {
		t.Fatal(err)
	}
	for until := time.Now().Add(15 * time.Second); time.Now().Before(until); {
		ds, err := b.Receive(ctx, q, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) > 0 {
			if id := ds[0].Message().ID; id != "stuck" {
				t.Fatalf("received %q, want stuck", id)
			}
			return
		}
	}
	t.Fatal("the job stored after the ready consumer was deleted was never received (every Receive empty, no error)")
}

// TestNoDeclareReceiveAfterReadyConsumerDeleted: as
// TestReceiveAfterReadyConsumerDeleted, with NoDeclare: the Broker may not
// declare the consumer again, and checkAckWait left a missing consumer "to
// the pull", which is never answered: every Receive returned no deliveries
// and no error, for ever, the jobs stranded and nothing said. A missing
// ready consumer is ErrNotFound, as a missing stream is.
func TestNoDeclareReceiveAfterReadyConsumerDeleted(t *testing.T) {
	owner := newBroker(t, testOpts)
	q := declare(t, owner, "consumergonenodecl")
	opts := testOpts
	opts.NoDeclare = true
	b := newBroker(t, opts)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	stream, _ := b.StreamNames(q)
	if err := rawJetStream(t).DeleteConsumer(ctx, stream, "berth"); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, q, &sdk.Message{ID: "stuck"}); err != nil {
		t.Fatal(err)
	}
	for until := time.Now().Add(10 * time.Second); time.Now().Before(until); {
		ds, err := b.Receive(ctx, q, 1)
		if errors.Is(err, sdk.ErrNotFound) {
			return
		}
		if err != nil || len(ds) > 0 {
			t.Fatalf("Receive without the ready consumer (NoDeclare): %d deliveries, %v; want ErrNotFound", len(ds), err)
		}
	}
	t.Fatal("Receive without the ready consumer (NoDeclare) returned nothing and no error, for ever")
}
