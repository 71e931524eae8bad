package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// TestStopReceivingThenReceive: StopReceiving hands back what the consumer
// holds beyond what Receive returned, at the same attempt; the delivery
// Receive returned still settles (the channel stays open); a Receive
// waiting on the queue meanwhile consumes again and gets what comes next.
func TestStopReceivingThenReceive(t *testing.T) {
	url, q, b := brokerOnQueue(t, Options{Prefetch: 5, Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.StopReceiving(ctx, q); err != nil { // no consumer yet: nothing to do
		t.Fatal(err)
	}
	pub := newBroker(t, url, Options{Logger: quiet})
	if err := pub.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := pub.Publish(ctx, q, &sdk.Message{Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive = %v, %v", ds, err)
	}
	held := ds[0]
	if err := b.StopReceiving(ctx, q); err != nil {
		t.Fatal(err)
	}
	if err := held.Ack(ctx); err != nil {
		t.Fatalf("Ack of a delivery Receive returned before StopReceiving: %v", err)
	}
	seen := map[string]bool{held.Message().ID: true}
	for len(seen) < 3 {
		ds, err := b.Receive(ctx, q, 3)
		if err != nil {
			t.Fatalf("Receive after StopReceiving: %v (got %d of 3)", err, len(seen))
		}
		for _, d := range ds {
			if seen[d.Message().ID] || d.Attempt() != 1 {
				t.Errorf("message %s: seen before %v, attempt %d", d.Message().ID, seen[d.Message().ID], d.Attempt())
			}
			seen[d.Message().ID] = true
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}

	// A Receive waiting while StopReceiving runs wants messages: it
	// consumes again.
	got := make(chan string, 1)
	go func() {
		ds, err := b.Receive(ctx, q, 1)
		if err != nil || len(ds) != 1 {
			got <- fmt.Sprintf("error: %v, %v", ds, err)
			return
		}
		_ = ds[0].Ack(ctx)
		got <- ds[0].Message().ID
	}()
	if err := b.StopReceiving(ctx, q); err != nil {
		t.Fatal(err)
	}
	m := &sdk.Message{Body: []byte("next")}
	if err := pub.Publish(ctx, q, m); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-got:
		if id != m.ID {
			t.Errorf("waiting Receive got %s, want %s", id, m.ID)
		}
	case <-ctx.Done():
		t.Fatal("a Receive waiting through StopReceiving got nothing")
	}
}

// TestStopReceivingDuringOutage: a pause while the consumer's channel is
// down (the connection lost, the server unreachable) has nothing to hand
// back: the server requeued what the channel held when it closed.
// StopReceiving returned only once a new channel was open, so through an
// outage it waited for its ctx (Worker.Pause's: a minute) and the Worker
// logged that handing back failed. It returns at once.
func TestStopReceivingDuringOutage(t *testing.T) {
	url := serverURL(t)
	p, purl := newProxy(t, url)
	q := testQueue(t, url)
	b := newBroker(t, purl, Options{Prefetch: 5, Logger: quiet, Reconnect: sdk.Backoff{Base: 20 * time.Millisecond, Max: 100 * time.Millisecond}})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.Publish(ctx, q, &sdk.Message{Body: []byte("x")}, &sdk.Message{Body: []byte("y")}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive = %v, %v", ds, err)
	}
	p.Refuse(true)
	p.Cut()
	for !errors.Is(ds[0].ExtendLease(ctx, time.Second), sdk.ErrLeaseLost) {
		if ctx.Err() != nil {
			t.Fatal("the broker never noticed the cut")
		}
		time.Sleep(5 * time.Millisecond)
	}
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	defer scancel()
	if err := b.StopReceiving(sctx, q); err != nil {
		t.Fatalf("StopReceiving with the consumer's channel down = %v, want nil (nothing is held)", err)
	}

	// Back up: paused, the consumer takes nothing until a Receive resumes
	// it, then gets both messages (requeued by the server at the cut).
	p.Refuse(false)
	got := map[string]bool{}
	for len(got) < 2 {
		ds, err := b.Receive(ctx, q, 2)
		if err != nil {
			t.Fatalf("Receive after the outage: %v (got %d of 2)", err, len(got))
		}
		for _, d := range ds {
			got[d.Message().ID] = true
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestStopReceivingDoneCtxStopsNothing: Worker.Resume cancels the ctx of
// the StopReceiving its Pause started, which may not have begun yet. Such a
// call paused the consumer all the same, after the Worker had resumed: the
// consumer handed back what it held (copies to the queue's tail) and
// waited for the next Receive to resume it. With ctx done it stops nothing.
func TestStopReceivingDoneCtxStopsNothing(t *testing.T) {
	url, q, b := brokerOnQueue(t, Options{Prefetch: 5, Logger: quiet})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	pub := newBroker(t, url, Options{Logger: quiet})
	if err := pub.DeclareQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, q, &sdk.Message{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive = %v, %v", ds, err)
	}
	done, stop := context.WithCancel(ctx)
	stop()
	if err := b.StopReceiving(done, q); !errors.Is(err, context.Canceled) {
		t.Errorf("StopReceiving with ctx done = %v, want context.Canceled", err)
	}
	b.mu.Lock()
	c := b.consumers[q]
	b.mu.Unlock()
	if paused, _, _ := c.pauseState(); paused {
		t.Error("StopReceiving with ctx done paused the consumer")
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPausedConsumerReopensAfterCut: a paused consumer's session waits for
// a resume without consuming, but its channel can still die (the
// connection cut). It did not notice: it went on waiting on the dead
// channel until a Receive resumed it, whose basic.consume then failed (a
// warning, a backoff) before a new channel was opened. It reopens at once,
// as a consuming session does, and stays paused on the new channel.
func TestPausedConsumerReopensAfterCut(t *testing.T) {
	url := serverURL(t)
	p, purl := newProxy(t, url)
	q := testQueue(t, url)
	b := newBroker(t, purl, Options{Prefetch: 5, Logger: quiet, Reconnect: sdk.Backoff{Base: 20 * time.Millisecond, Max: 100 * time.Millisecond}})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.Publish(ctx, q, &sdk.Message{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive = %v, %v", ds, err)
	}
	if err := b.StopReceiving(ctx, q); err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	c := b.consumers[q]
	b.mu.Unlock()
	old := c.cur.Load()
	p.Cut()
	for {
		if st := c.cur.Load(); st != old && !st.isDead() {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the paused consumer did not open a new channel after the cut")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if paused, _, _ := c.pauseState(); !paused {
		t.Error("the consumer was resumed by its reconnect")
	}
	// Resumed, it consumes on the new channel: the message, requeued by the
	// server at the cut, comes back.
	ds, err = b.Receive(ctx, q, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive after the cut = %v, %v", ds, err)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
}
