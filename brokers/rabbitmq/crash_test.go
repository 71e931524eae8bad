package rabbitmq

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestWorkerKilledMidBatch SIGKILLs a worker process that holds a batch it
// has half acked: the server redelivers the unacked half with the attempt
// counted. Messages published afterwards start at attempt 1. (The batch is
// the whole queue at the time: an ack frees a prefetch slot, and a message
// prefetched into the dying process would be counted as delivered too.)
func TestWorkerKilledMidBatch(t *testing.T) {
	url, q, b := brokerOnQueue(t, Options{Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	const total, batch = 30, 10
	msgs := make([]*sdk.Message, total)
	for i := range msgs {
		msgs[i] = &sdk.Message{Type: "crash.batch", Body: []byte(strconv.Itoa(i))}
	}
	if err := b.Publish(ctx, q, msgs[:batch]...); err != nil {
		t.Fatal(err)
	}

	c := startChild(t, "hold", url, q, helperHold+"="+strconv.Itoa(batch))
	acked, held := map[string]bool{}, map[string]bool{}
	for f := c.next(t, 30*time.Second); ; f = c.next(t, 30*time.Second) {
		if f == nil {
			t.Fatal("the child exited before READY")
		}
		if f[0] == "READY" {
			break
		}
		switch f[0] {
		case "ACKED":
			acked[f[1]] = true
		case "HELD":
			held[f[1]] = true
			if f[2] != "1" {
				t.Errorf("child saw %s at attempt %s, want 1", f[1], f[2])
			}
		}
	}
	c.kill(t)
	if len(held) != batch/2 || len(acked) != batch/2 {
		t.Fatalf("child acked %d and held %d, want %d each", len(acked), len(held), batch/2)
	}
	// Wait for the server to see the child's connection gone.
	for {
		info, err := b.Info(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if info.Consumers == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := b.Publish(ctx, q, msgs[batch:]...); err != nil {
		t.Fatal(err)
	}

	attempts := map[string]int{}
	for len(attempts) < total-len(acked) {
		ds, err := b.Receive(ctx, q, total)
		if err != nil {
			t.Fatalf("Receive: %v (after %d deliveries)", err, len(attempts))
		}
		for _, d := range ds {
			id := d.Message().ID
			if acked[id] {
				// Only possible if the ack died with the process before
				// reaching the server; then it must count as an attempt.
				t.Logf("acked message %s redelivered (its ack died with the child)", id)
				if d.Attempt() != 2 {
					t.Errorf("redelivered %s: attempt %d, want 2", id, d.Attempt())
				}
			} else {
				if _, dup := attempts[id]; dup {
					t.Errorf("message %s delivered twice to the parent", id)
				}
				attempts[id] = d.Attempt()
			}
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, m := range msgs {
		switch {
		case acked[m.ID]:
		case held[m.ID]:
			if attempts[m.ID] != 2 {
				t.Errorf("held message %s redelivered at attempt %d, want 2", m.ID, attempts[m.ID])
			}
		default:
			if attempts[m.ID] != 1 {
				t.Errorf("message %s published after the kill: attempt %d, want 1", m.ID, attempts[m.ID])
			}
		}
	}
}

// TestPoisonCrashesEndInDLQ: a message that kills the worker process every
// time it is handled is dead-lettered by the server's delivery limit after
// MaxDeliveries crashes, and every other message is processed once, at
// attempt 1.
func TestPoisonCrashesEndInDLQ(t *testing.T) {
	url := serverURL(t)
	q := testQueue(t, url)
	const maxDeliveries = 3
	b := newBroker(t, url, Options{Logger: quiet, MaxDeliveries: maxDeliveries})
	ctx, cancel := context.WithTimeout(t.Context(), 80*time.Second)
	defer cancel()
	if err := b.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	var msgs []*sdk.Message
	for i := range 10 {
		msgs = append(msgs, &sdk.Message{Type: "crash.normal", Body: []byte(strconv.Itoa(i))})
		if i == 2 {
			msgs = append(msgs, &sdk.Message{Type: "poison"})
		}
	}
	poison := msgs[3]
	if err := b.Publish(ctx, q, msgs...); err != nil {
		t.Fatal(err)
	}

	done := map[string]string{} // id → attempt
	var crashes []string        // attempts at which the poison crashed a child
	for dead := false; !dead; {
		if len(crashes) > maxDeliveries {
			t.Fatalf("poison crashed %d children, more than MaxDeliveries %d", len(crashes), maxDeliveries)
		}
		c := startChild(t, "worker", url, q)
		for f := c.next(t, 30*time.Second); f != nil; f = c.next(t, 30*time.Second) {
			switch f[0] {
			case "DONE":
				if prev, dup := done[f[1]]; dup {
					t.Errorf("message %s done twice (attempts %s, %s)", f[1], prev, f[2])
				}
				done[f[1]] = f[2]
			case "CRASH":
				crashes = append(crashes, f[2])
			}
			// After MaxDeliveries crashes the server dead-letters the
			// poison; once the others are done too, the run is over.
			if !dead && len(crashes) == maxDeliveries && len(done) == len(msgs)-1 {
				waitDeadLetter(t, ctx, b, q, poison.ID)
				dead = true
				c.kill(t)
			}
		}
	}
	for i, a := range crashes {
		if a != strconv.Itoa(i+1) {
			t.Errorf("crash %d at attempt %s, want %d", i+1, a, i+1)
		}
	}
	if len(crashes) != maxDeliveries {
		t.Errorf("poison crashed %d children, want MaxDeliveries = %d", len(crashes), maxDeliveries)
	}
	for id, a := range done {
		if id == poison.ID {
			t.Errorf("poison %s was handled", id)
		}
		if a != "1" {
			t.Errorf("message %s done at attempt %s, want 1: the poison disturbed it", id, a)
		}
	}
	m, err := b.GetDeadLetter(ctx, q, poison.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Header(sdk.HeaderDeadLetterClass); got != string(sdk.ClassPoison) {
		t.Errorf("dead letter class %q, want %q", got, sdk.ClassPoison)
	}
	if got := m.Header(sdk.HeaderDeadLetterQueue); got != q {
		t.Errorf("dead letter queue header %q, want %q", got, q)
	}
}

// waitDeadLetter waits, within ctx, for message id in q's dead-letter queue.
func waitDeadLetter(t *testing.T, ctx context.Context, b *Broker, q, id string) {
	t.Helper()
	for {
		_, err := b.GetDeadLetter(ctx, q, id)
		if err == nil {
			return
		}
		if !errors.Is(err, sdk.ErrNotFound) {
			t.Fatalf("GetDeadLetter(%s): %v", id, err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("poison %s never reached the dead-letter queue", id)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
