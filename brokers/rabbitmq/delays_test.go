package rabbitmq

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// declareBucketWithoutDLX declares q's delay queue of ttl with the TTL but
// no dead-lettering: the server drops what expires there, so only a mover
// can bring a message from it back to q.
func declareBucketWithoutDLX(t *testing.T, url, q string, ttl time.Duration) {
	t.Helper()
	ch := ownChannel(t, url, false)
	if _, err := ch.QueueDeclare(DelayQueue(q, ttl), true, false, false, false,
		amqp.Table{"x-queue-type": "quorum", "x-message-ttl": ttl.Milliseconds()}); err != nil {
		t.Fatal(err)
	}
}

// waitBucketConsumers waits until the delay queue has n consumers.
func waitBucketConsumers(t *testing.T, b *Broker, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		qi, err := b.inspect(t.Context(), name)
		if err == nil && qi.Consumers >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("delay queue %s: %d consumers (%v), want %d", name, qi.Consumers, err, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// receiveOne receives one delivery of q within d, or nil.
func receiveOne(t *testing.T, b *Broker, q string, d time.Duration) sdk.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	ds, err := b.Receive(ctx, q, 1)
	if err != nil {
		return nil
	}
	return ds[0]
}

// A process that consumes a queue moves its delay queues' messages back
// itself when they are due: the message arrives although the server would
// have dropped it at expiry (its delay queue here has no dead-lettering),
// not before its delay, with its attempt unchanged. With the movers off the
// same message is lost to the server's expiry, which is what shows the
// move is the mover's.
func TestDelayMovedByConsumingProcess(t *testing.T) {
	url := serverURL(t)
	const ttl = time.Second
	for _, move := range []bool{true, false} {
		name := map[bool]string{true: "mover", false: "server-only"}[move]
		t.Run(name, func(t *testing.T) {
			q := testQueue(t, url)
			opts := Options{Logger: quiet, NoDeclare: true, DelayBuckets: []time.Duration{ttl}}
			if !move {
				opts.MoveDelaysUpTo = -1
			}
			b := newBroker(t, url, opts)
			if err := b.DeclareQueue(t.Context(), q); err != nil {
				t.Fatal(err)
			}
			declareBucketWithoutDLX(t, url, q, ttl)
			// The first Receive starts the consumer and its movers.
			if d := receiveOne(t, b, q, 100*time.Millisecond); d != nil {
				t.Fatalf("unexpected delivery %s", d.Message().ID)
			}
			if move {
				waitBucketConsumers(t, b, DelayQueue(q, ttl), 1)
			}
			m := &sdk.Message{Type: "delayed", Body: []byte("x"), Delay: ttl}
			m.SetHeader("k", "v")
			sent := time.Now()
			if err := b.Publish(t.Context(), q, m); err != nil {
				t.Fatal(err)
			}
			wait := 10*time.Second + ttl
			if !move {
				wait = 3 * ttl // the server drops it at ttl
			}
			d := receiveOne(t, b, q, wait)
			if !move {
				if d != nil {
					t.Fatalf("message %s arrived without a mover: the delay queue dead-letters after all", d.Message().ID)
				}
				return
			}
			if d == nil {
				t.Fatal("the delayed message never arrived")
			}
			if waited := time.Since(sent); waited < ttl {
				t.Errorf("arrived after %s, before its delay %s", waited, ttl)
			}
			if d.Message().ID != m.ID || d.Message().Header("k") != "v" || d.Attempt() != 1 {
				t.Errorf("got %s header k=%q attempt %d, want %s k=v attempt 1", d.Message().ID, d.Message().Header("k"), d.Attempt(), m.ID)
			}
			if err := d.Ack(t.Context()); err != nil {
				t.Fatal(err)
			}
			if d := receiveOne(t, b, q, 2*ttl); d != nil {
				t.Errorf("a second copy of %s arrived", d.Message().ID)
			}
		})
	}
}

// What a mover holds when its broker closes goes back to the delay queue
// and arrives once through the server's dead-lettering: nothing is lost.
func TestDelayMoverHandsBackOnClose(t *testing.T) {
	url := serverURL(t)
	q := testQueue(t, url)
	const ttl = 5 * time.Second
	b := newBroker(t, url, Options{Logger: quiet, DelayBuckets: []time.Duration{ttl}})
	if err := b.DeclareQueue(t.Context(), q); err != nil {
		t.Fatal(err)
	}
	if d := receiveOne(t, b, q, 100*time.Millisecond); d != nil {
		t.Fatalf("unexpected delivery %s", d.Message().ID)
	}
	m := &sdk.Message{Type: "delayed", Body: []byte("x"), Delay: ttl}
	if err := b.Publish(t.Context(), q, m); err != nil {
		t.Fatal(err)
	}
	waitBucketConsumers(t, b, DelayQueue(q, ttl), 1)
	deadline := time.Now().Add(10 * time.Second)
	for b.heldDelayed(q) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the mover never took the message")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b2 := newBroker(t, url, Options{Logger: quiet, DelayBuckets: []time.Duration{ttl}, MoveDelaysUpTo: -1})
	d := receiveOne(t, b2, q, 20*time.Second)
	if d == nil || d.Message().ID != m.ID {
		t.Fatalf("got %v, want message %s back", d, m.ID)
	}
	if err := d.Ack(t.Context()); err != nil {
		t.Fatal(err)
	}
	if d := receiveOne(t, b2, q, 2*time.Second); d != nil {
		t.Errorf("a second copy of %s arrived", d.Message().ID)
	}
}

// A mover whose channel restarts takes back what it held as redeliveries:
// their wait counts from when they entered the delay queue (the copy's
// timestamp), not again from the redelivery — a restart in the middle of a
// delay must not stretch it by up to another delay.
func TestDelayMoverRestartKeepsDue(t *testing.T) {
	url := serverURL(t)
	q := testQueue(t, url)
	const ttl = 6 * time.Second
	b := newBroker(t, url, Options{Logger: quiet, DelayBuckets: []time.Duration{ttl}})
	if err := b.DeclareQueue(t.Context(), q); err != nil {
		t.Fatal(err)
	}
	if d := receiveOne(t, b, q, 100*time.Millisecond); d != nil {
		t.Fatalf("unexpected delivery %s", d.Message().ID)
	}
	m := &sdk.Message{Type: "delayed", Body: []byte("x"), Delay: ttl}
	sent := time.Now()
	if err := b.Publish(t.Context(), q, m); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(ttl / 2)
	for b.heldDelayed(q) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the mover never took the message")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Two thirds in: held again for a whole ttl, it would arrive after
	// 1⅔ ttl, well past the limit below, which leaves room for a loaded
	// machine.
	time.Sleep(time.Until(sent.Add(ttl * 2 / 3)))
	b.resetMover(DelayQueue(q, ttl)) // the channel goes: the message is redelivered to the next one
	deadline = time.Now().Add(10 * time.Second)
	for b.heldDelayed(q) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the mover never let go of the message")
		}
		time.Sleep(10 * time.Millisecond)
	}
	d := receiveOne(t, b, q, 3*ttl)
	if d == nil || d.Message().ID != m.ID {
		t.Fatalf("got %v, want message %s", d, m.ID)
	}
	waited := time.Since(sent)
	if waited < ttl {
		t.Errorf("arrived after %s, before its delay %s", waited, ttl)
	}
	// Before: held again for the whole ttl from the redelivery (≥ 1⅔ ttl).
	// Now: due at the stamp's second + 1 s + ttl, at most ttl + 1 s after the
	// send; the margin (2 s) is for a loaded machine.
	if limit := ttl + ttl/2; waited > limit {
		t.Errorf("arrived after %s: the restart started its delay again (want under %s)", waited, limit)
	}
	if err := d.Ack(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// redeliveredDue keeps a redelivery's due within [now, now+ttl] whatever its
// stamp says, and uses the stamp only for redeliveries.
func TestRedeliveredDueBounds(t *testing.T) {
	now := time.Date(2026, 12, 5, 10, 0, 0, 500e6, time.UTC)
	const ttl = 10 * time.Second
	stamp := func(ago time.Duration) time.Time { return now.Add(-ago).Truncate(time.Second) }
	for _, c := range []struct {
		name string
		d    amqp.Delivery
		want time.Time
	}{
		{"first delivery", amqp.Delivery{Timestamp: stamp(4 * time.Second)}, now.Add(ttl)},
		{"no stamp", amqp.Delivery{Redelivered: true}, now.Add(ttl)},
		{"stamped 4 s ago", amqp.Delivery{Redelivered: true, Timestamp: stamp(4 * time.Second)}, stamp(4 * time.Second).Add(time.Second + ttl)},
		{"stamped long ago", amqp.Delivery{Redelivered: true, Timestamp: stamp(time.Hour)}, now},
		{"stamped in the future", amqp.Delivery{Redelivered: true, Timestamp: now.Add(time.Hour)}, now.Add(ttl)},
	} {
		if got := redeliveredDue(c.d, now, ttl); !got.Equal(c.want) {
			t.Errorf("%s: due %s, want %s", c.name, got, c.want)
		}
	}
}
