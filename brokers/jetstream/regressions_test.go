package jetstream_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/sdk"
)

// receiveIDs receives from q until want messages have come or timeout
// passes, acknowledging each, and returns each ID's attempts in order.
func receiveIDs(ctx context.Context, t *testing.T, b *jetstream.Broker, q string, want int, timeout time.Duration) map[string][]int {
	t.Helper()
	got := map[string][]int{}
	n := 0
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline) && n < want; {
		ds, err := b.Receive(ctx, q, 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			got[d.Message().ID] = append(got[d.Message().ID], d.Attempt())
			n++
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	return got
}

// A user message ID equal to one of berth's own Nats-Msg-Ids (old or new
// form) must neither make JetStream drop berth's copy (the mover's, here:
// the delayed job was lost) nor berth's copy drop the user's message.
func TestFixInternalIDsDisjointFromUserIDs(t *testing.T) {
	b := newBroker(t, jetstream.Options{AckWait: 5 * time.Second, WaitTime: 500 * time.Millisecond, Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
	defer cancel()

	t.Run("mover", func(t *testing.T) {
		q := declare(t, b, "fixmv")
		stream, _ := b.StreamNames(q)
		if err := b.Publish(ctx, q, &sdk.Message{ID: "delayed-job", Type: "x", Delay: time.Second}); err != nil {
			t.Fatal(err)
		}
		// The delayed job is stream sequence 1: the mover's ID derives from it.
		for _, id := range []string{"mv:" + stream + ":1", "berth mv:" + stream + ":1"} {
			if err := b.Publish(ctx, q, &sdk.Message{ID: id, Type: "x"}); err != nil {
				t.Fatal(err)
			}
		}
		got := receiveIDs(ctx, t, b, q, 3, 8*time.Second)
		if len(got) != 3 || got["delayed-job"] == nil {
			t.Fatalf("received %v, want the delayed job and both user messages", got)
		}
	})

	t.Run("release", func(t *testing.T) {
		q := declare(t, b, "fixrel")
		stream, _ := b.StreamNames(q)
		if err := b.Publish(ctx, q, &sdk.Message{ID: "job", Type: "x"}); err != nil {
			t.Fatal(err)
		}
		ds, err := b.Receive(ctx, q, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("Receive: %d %v", len(ds), err)
		}
		if err := ds[0].(sdk.Releaser).Release(ctx, 0); err != nil {
			t.Fatal(err)
		}
		// The release's copy derives its ID from sequence 1, delivery 1.
		for _, id := range []string{"rel:" + stream + ":1:1", "berth rel:" + stream + ":1:1"} {
			if err := b.Publish(ctx, q, &sdk.Message{ID: id, Type: "x"}); err != nil {
				t.Fatal(err)
			}
		}
		got := receiveIDs(ctx, t, b, q, 3, 5*time.Second)
		if len(got) != 3 || got["job"] == nil {
			t.Fatalf("received %v, want the released job and both user messages", got)
		}
	})
}

// The attempt a delivery reports comes from JetStream's delivery count and
// from berth's own carry-over (Release) only: a Berth-Message header written
// by another producer cannot set it, on the ready subject or through the
// delayed one, and no value of it dead-letters a message unrun or overflows.
func TestFixForgedAttemptIgnored(t *testing.T) {
	b := newBroker(t, jetstream.Options{AckWait: 5 * time.Second, WaitTime: 500 * time.Millisecond, MaxDeliveries: 10, Logger: quiet})
	q := declare(t, b, "fixatt")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	js, err := njs.New(b.Conn())
	if err != nil {
		t.Fatal(err)
	}
	delayed := "berth.d." + b.Subject(q)[len("berth.q."):]
	for _, p := range []struct{ subject, env string }{
		{b.Subject(q), `{"v":1,"id":"f7","a":7}`},
		{b.Subject(q), `{"v":1,"id":"f1000","a":1000}`},
		{b.Subject(q), `{"v":1,"id":"fmax","a":9223372036854775807}`},
		{b.Subject(q), `{"v":1,"id":"fneg","a":-5}`},
		{delayed, `{"v":1,"id":"fdelayed","a":7}`},
	} {
		m := &nats.Msg{Subject: p.subject, Header: nats.Header{"Berth-Message": []string{p.env}}}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	got := receiveIDs(ctx, t, b, q, 5, 6*time.Second)
	for _, id := range []string{"f7", "f1000", "fmax", "fneg", "fdelayed"} {
		if a := got[id]; len(a) != 1 || a[0] != 1 {
			t.Errorf("%s: attempts %v, want [1]", id, a)
		}
	}
	if dls, _ := b.ListDeadLetters(ctx, q, 10); len(dls) > 0 {
		t.Errorf("%d dead letters, want none", len(dls))
	}

	// berth's own carry-over still counts: attempt 2, released, comes
	// back as attempt 2, directly and through the delayed subject.
	for _, delay := range []time.Duration{0, 300 * time.Millisecond} {
		if err := b.Publish(ctx, q, &sdk.Message{ID: "carry-" + delay.String(), Type: "x"}); err != nil {
			t.Fatal(err)
		}
		var attempts []int
		for deadline := time.Now().Add(8 * time.Second); time.Now().Before(deadline) && len(attempts) < 3; {
			ds, err := b.Receive(ctx, q, 1)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range ds {
				attempts = append(attempts, d.Attempt())
				switch len(attempts) {
				case 1:
					err = d.Retry(ctx, 0, errors.New("again"))
				case 2:
					err = d.(sdk.Releaser).Release(ctx, delay)
				default:
					err = d.Ack(ctx)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
		}
		if len(attempts) != 3 || attempts[0] != 1 || attempts[1] != 2 || attempts[2] != 2 {
			t.Errorf("release with delay %s: attempts %v, want [1 2 2]", delay, attempts)
		}
	}
}

// After another process deletes a queue, Publish declares it again (and
// PublishAsync on its next call) instead of failing with ErrUnavailable for
// ever; with NoDeclare it reports ErrNotFound.
func TestFixPublishAfterDeleteElsewhere(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
	defer cancel()
	other := newBroker(t, jetstream.Options{Logger: quiet})

	t.Run("Publish", func(t *testing.T) {
		b := newBroker(t, jetstream.Options{AckWait: 5 * time.Second, WaitTime: 500 * time.Millisecond, Logger: quiet})
		q := declare(t, b, "fixdel")
		if err := other.DeleteQueue(ctx, q); err != nil {
			t.Fatal(err)
		}
		if err := b.Publish(ctx, q, &sdk.Message{ID: "one", Type: "x"}); err != nil {
			t.Fatalf("Publish after the queue was deleted elsewhere: %v", err)
		}
		if err := other.DeleteQueue(ctx, q); err != nil {
			t.Fatal(err)
		}
		if err := b.Publish(ctx, q, &sdk.Message{ID: "two", Type: "x"}, &sdk.Message{ID: "three", Type: "x"}); err != nil {
			t.Fatalf("batch Publish after the queue was deleted elsewhere: %v", err)
		}
		if got := receiveIDs(ctx, t, b, q, 2, 5*time.Second); len(got) != 2 || got["two"] == nil || got["three"] == nil {
			t.Fatalf("received %v, want two and three", got)
		}
	})

	t.Run("PublishAsync", func(t *testing.T) {
		b := newBroker(t, jetstream.Options{AckWait: 5 * time.Second, WaitTime: 500 * time.Millisecond, Logger: quiet})
		q := declare(t, b, "fixdela")
		if err := other.DeleteQueue(ctx, q); err != nil {
			t.Fatal(err)
		}
		var err error
		for i := 0; i < 2; i++ { // the first may fail: its result was out before the answer
			var res *sdk.PublishResult
			if res, err = b.PublishAsync(ctx, q, &sdk.Message{Type: "x"}); err == nil {
				err = res.Wait(ctx)
			}
			t.Logf("PublishAsync %d: %v", i, err)
		}
		if err != nil {
			t.Fatalf("second PublishAsync after the queue was deleted elsewhere: %v", err)
		}
	})

	t.Run("NoDeclare", func(t *testing.T) {
		b := newBroker(t, jetstream.Options{NoDeclare: true, Logger: quiet})
		q := declare(t, other, "fixdeln")
		if err := b.Publish(ctx, q, &sdk.Message{Type: "x"}); err != nil {
			t.Fatal(err)
		}
		if err := other.DeleteQueue(ctx, q); err != nil {
			t.Fatal(err)
		}
		err := b.Publish(ctx, q, &sdk.Message{Type: "x"})
		if !errors.Is(err, sdk.ErrNotFound) {
			t.Fatalf("Publish (NoDeclare) after the queue was deleted elsewhere: %v, want ErrNotFound", err)
		}
	})
}

// A delivery's lease is counted from when its message arrived, not from
// when Receive got to it after dead-lettering the poison messages before it
// in the batch (slow here: the dead-letter stream is gone): an Ack after the
// server redelivered the message is refused with ErrLeaseLost.
func TestFixLeaseCountedFromArrival(t *testing.T) {
	b := newBroker(t, jetstream.Options{AckWait: 2 * time.Second, WaitTime: 700 * time.Millisecond, Logger: quiet})
	q := declare(t, b, "fixstale")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	js, err := njs.New(b.Conn())
	if err != nil {
		t.Fatal(err)
	}
	stream, dlq := b.StreamNames(q)
	for i := 0; i < 3; i++ { // undecodable: dead-lettered at receive
		m := &nats.Msg{Subject: b.Subject(q), Header: nats.Header{"Berth-Message": []string{"{"}}}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Publish(ctx, q, &sdk.Message{ID: "good", Type: "x"}); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, dlq); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	ds, err := b.Receive(ctx, q, 10)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive: %d %v", len(ds), err)
	}
	t.Logf("Receive returned after %s", time.Since(t0))
	time.Sleep(time.Until(t0.Add(2300 * time.Millisecond)))
	cons, err := js.Consumer(ctx, stream, "berth")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(10, njs.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	redelivered := false
	for m := range batch.Messages() {
		if m.Headers().Get(nats.MsgIdHdr) == "good" {
			redelivered = true
		}
	}
	if !redelivered {
		t.Skip("not redelivered yet")
	}
	if err := ds[0].Ack(ctx); !errors.Is(err, sdk.ErrLeaseLost) {
		t.Fatalf("Ack after the server redelivered the message: %v, want ErrLeaseLost", err)
	}
}
