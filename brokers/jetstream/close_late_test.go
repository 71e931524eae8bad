package jetstream_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/sdk"
)

// TestCloseDuringLongPollKeepsLateDelivery: a Broker closed while a
// Receive's long poll is open at the server gives back, without consuming
// an attempt, a message the server delivers to that poll after the pull
// read its channel and before the server processed the unsubscription.
// Before, the pull read only what its channel held and unsubscribed:
// nats.go dropped what came to the inbox after (the server had counted the
// delivery), and the message came back only after its AckWait, at attempt
// 2 (seen in a chaos run of rolling SIGTERMs of Workers).
func TestCloseDuringLongPollKeepsLateDelivery(t *testing.T) {
	opts := jetstream.Options{AckWait: 20 * time.Second, WaitTime: 10 * time.Second, Logger: quiet}
	b := newBroker(t, opts)
	other := newBroker(t, opts)
	q := declare(t, b, "closelate")
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
	defer cancel()
	stream, _ := b.StreamNames(q)
	cons, err := rawJetStream(t).Consumer(ctx, stream, "berth")
	if err != nil {
		t.Fatal(err)
	}
	msg := &sdk.Message{Type: "closelate"}
	hookErr := make(chan error, 1)
	defer jetstream.SetClosePullHook(func(pb *jetstream.Broker, consumer string, held func() int) {
		if pb != b || consumer != "berth" { // not the delay mover's pull

			return
		}
		// The long poll is still open at the server: it delivers this
		// message to the pull's inbox, after the pull read it.
		if err := other.Publish(ctx, q, msg); err != nil {
			hookErr <- err
			return
		}
		for deadline := time.Now().Add(5 * time.Second); held() == 0 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		if held() == 0 {
			hookErr <- errors.New("the open long poll was not answered")
			return
		}
		hookErr <- nil
	})()
	received := make(chan error, 1)
	go func() {
		ds, err := b.Receive(ctx, q, 1)
		if len(ds) > 0 {
			err = errors.New("Receive returned deliveries")
		}
		received <- err
	}()
	// Close once the long poll waits at the server.
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumWaiting > 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-received; !errors.Is(err, sdk.ErrClosed) {
		t.Fatalf("Receive during Close: %v, want ErrClosed", err)
	}
	select {
	case err := <-hookErr:
		if err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatal("Close did not interrupt the long poll")
	}
	ackAllAtFirstAttempt(ctx, t, other, q, []*sdk.Message{msg}, map[string]int{})
}
