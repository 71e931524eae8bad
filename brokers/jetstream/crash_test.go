package jetstream_test

import (
	"context"
	"errors"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// TestWorkerKilledMidBatch SIGKILLs a worker process that holds a batch it
// has half acked: JetStream redelivers the unacked half after AckWait with
// the attempt counted, never the acked half, and messages published
// afterwards start at attempt 1.
func TestWorkerKilledMidBatch(t *testing.T) {
	url := integration.NATSURL(t)
	b := newBroker(t, jetstream.Options{AckWait: childAckWait, WaitTime: 700 * time.Millisecond, Logger: quiet})
	q := declare(t, b, "crash")
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
				t.Errorf("message %s, acked by the child (its Ack returned nil), delivered again", id)
			} else if _, dup := attempts[id]; dup {
				t.Errorf("message %s delivered twice to the parent", id)
			}
			attempts[id] = d.Attempt()
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
// time it is handled is dead-lettered after MaxDeliveries crashes (berth's
// NumDelivered check at receive), with the poison class; every other
// message is handled once, at attempt 1. The poison is published last: a
// message the dying worker had received along with it (the Worker receives
// ahead of its handlers) counts those deliveries too on JetStream, and
// after MaxDeliveries crashes would be dead-lettered with it.
func TestPoisonCrashesEndInDLQ(t *testing.T) {
	url := integration.NATSURL(t)
	b := newBroker(t, jetstream.Options{AckWait: childAckWait, WaitTime: 700 * time.Millisecond, MaxDeliveries: childMaxDeliveries, Logger: quiet})
	q := declare(t, b, "poison")
	ctx, cancel := context.WithTimeout(t.Context(), 80*time.Second)
	defer cancel()
	var msgs []*sdk.Message
	for i := range 10 {
		msgs = append(msgs, &sdk.Message{Type: "crash.normal", Body: []byte(strconv.Itoa(i))})
	}
	poison := &sdk.Message{Type: "poison"}
	msgs = append(msgs, poison)
	if err := b.Publish(ctx, q, msgs...); err != nil {
		t.Fatal(err)
	}
	done := map[string]string{} // id → attempt
	var crashes []string        // attempts at which the poison crashed a child
	for dead := false; !dead; {
		if len(crashes) > childMaxDeliveries {
			t.Fatalf("poison crashed %d children, more than MaxDeliveries %d", len(crashes), childMaxDeliveries)
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
			// After MaxDeliveries crashes, the next worker's Receive
			// takes the poison once more and dead-letters it instead of
			// handing it out (JetStream's MaxDeliver is not used).
			if !dead && f[0] == "READY" && len(crashes) == childMaxDeliveries && len(done) == len(msgs)-1 {
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
	for id, a := range done {
		if id == poison.ID {
			t.Errorf("poison %s was handled", id)
		}
		if a != "1" {
			t.Errorf("message %s done at attempt %s, want 1", id, a)
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

// waitDeadLetter waits, within ctx, for message id in q's dead letters.
func waitDeadLetter(t *testing.T, ctx context.Context, b *jetstream.Broker, q, id string) {
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
			t.Fatalf("poison %s never reached the dead letters", id)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestAckSurvivesCrash: a worker process SIGKILLed the moment Ack returned
// has not lost the ack. Ack waits for the server's answer (unless
// Options.AsyncAck): ten children each receive one message, ack it and
// kill themselves; none of the ten comes back after AckWait, when a lost
// ack would have made JetStream deliver it again.
func TestAckSurvivesCrash(t *testing.T) {
	url := integration.NATSURL(t)
	b := newBroker(t, jetstream.Options{AckWait: childAckWait, WaitTime: 700 * time.Millisecond, Logger: quiet})
	q := declare(t, b, "ackkill")
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	const n = 10
	for i := range n {
		if err := b.Publish(ctx, q, &sdk.Message{Type: "crash.ack", Body: []byte(strconv.Itoa(i))}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		c := startChild(t, "ackkill", url, q)
		for f := c.next(t, 30*time.Second); f != nil; f = c.next(t, 30*time.Second) {
			t.Errorf("child %d: %v", i, f) // it prints only errors
		}
		_ = c.Wait()
		if ws, ok := c.Cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("child %d: %v (want killed by its own SIGKILL after Ack)", i, c.Cmd.ProcessState)
		}
	}
	// A lost ack shows as its message delivered again once AckWait has
	// passed since the child received it.
	time.Sleep(2 * childAckWait)
	for range 3 {
		ds, err := b.Receive(ctx, q, n)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			t.Errorf("message %s (body %s), acked by a child whose Ack returned nil, delivered again at attempt %d", d.Message().ID, d.Message().Body, d.Attempt())
		}
	}
}
