package jetstream_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/sdk"
)

// TestCloseDuringPullGivesBack: a Broker closed while a Receive's pull is
// being answered gives back, without consuming an attempt, every message
// that pull read or had on its way: it could not be settled on the closed
// Broker. Before, the messages read were returned (unsettleable) and those
// buffered dropped: all came back only after their AckWait, an attempt
// spent.
func TestCloseDuringPullGivesBack(t *testing.T) {
	closeDuringReceive(t, "closeback", 40) // Close as the pull's answer arrives
}

// TestCloseAsPullFillsGivesBack: a Broker closed as the last message of a
// Receive's batch arrives. The pull, its batch full, returned without
// looking at Close, and Receive returned the deliveries: their caller
// could not settle them on the closed Broker (ErrClosed), and the message
// came back only after its AckWait, an attempt spent, although the doc
// promises that a Receive Close interrupts returns ErrClosed and gives
// back what its pull read.
func TestCloseAsPullFillsGivesBack(t *testing.T) {
	closeDuringReceive(t, "closefull", 1) // Close as the batch's last message arrives
}

// closeDuringReceive publishes n messages to queue, closes the Broker as
// the answer of a Receive of n arrives, and checks that the Receive
// returned none and ErrClosed, and that another Broker then gets every
// message at its first attempt (given back, no attempt spent).
func closeDuringReceive(t *testing.T, queue string, n int) {
	t.Helper()
	opts := jetstream.Options{AckWait: 20 * time.Second, WaitTime: 700 * time.Millisecond, Logger: quiet}
	b := newBroker(t, opts)
	other := newBroker(t, opts)
	q := declare(t, b, queue)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	msgs := make([]*sdk.Message, n)
	for i := range msgs {
		msgs[i] = &sdk.Message{Type: queue}
	}
	if err := b.Publish(ctx, q, msgs...); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	var closed sync.WaitGroup
	defer closed.Wait()
	defer jetstream.SetPullHook(func(pb *jetstream.Broker) {
		if pb != b {
			return
		}
		once.Do(func() {
			closed.Go(func() { _ = b.Close() })
			<-b.Closing()
		})
	})()
	ds, err := b.Receive(ctx, q, n)
	if !errors.Is(err, sdk.ErrClosed) || len(ds) != 0 {
		for _, d := range ds {
			t.Logf("delivery %s: Ack on the closed Broker: %v", d.Message().ID, d.Ack(ctx))
		}
		t.Errorf("Receive during Close: %d deliveries, %v; want none, ErrClosed", len(ds), err)
	}
	closed.Wait()
	ackAllAtFirstAttempt(ctx, t, other, q, msgs, map[string]int{})
}
