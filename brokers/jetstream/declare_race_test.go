package jetstream_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/integration"
)

// TestConcurrentFirstDeclareKeepsLongest: several Brokers of one queue,
// each with its own AckWait and Duplicates window, declare it for the first
// time at the same instant. Each counts its leases by its own AckWait and
// promises its own window, so the ready consumer's AckWait and both
// streams' windows must end at least the longest of them. Declaring read
// the stream and consumer, then created or updated them with what it read:
// every Broker read "absent" and the last write won, however short (or a
// Broker's create lost to another's and its DeclareQueue failed with
// "stream name already in use").
func TestConcurrentFirstDeclareKeepsLongest(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	const brokers = 6
	bs := make([]*jetstream.Broker, brokers)
	for i := range bs {
		bs[i] = newBroker(t, jetstream.Options{
			AckWait:    time.Duration(i+1) * time.Second,
			Duplicates: time.Duration(i+2) * time.Minute,
			WaitTime:   500 * time.Millisecond,
			Logger:     quiet,
		})
	}
	wantAckWait, wantDups := time.Duration(brokers)*time.Second, time.Duration(brokers+1)*time.Minute
	js := rawJetStream(t)
	for round := range 4 {
		q := fmt.Sprintf("declrace_%d_%s", round, suffix())
		t.Cleanup(func() { deleteQueue(t, q) })
		start := make(chan struct{})
		errs := make(chan error, brokers)
		var wg sync.WaitGroup
		for _, b := range bs {
			wg.Go(func() {
				<-start
				errs <- b.DeclareQueue(ctx, q)
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("round %d: DeclareQueue: %v", round, err)
			}
		}
		stream, dlq := bs[0].StreamNames(q)
		c, err := js.Consumer(ctx, stream, "berth")
		if err != nil {
			t.Fatal(err)
		}
		if got := c.CachedInfo().Config.AckWait; got != wantAckWait {
			t.Errorf("round %d: consumer AckWait %s after concurrent first declares, want %s (the longest)", round, got, wantAckWait)
		}
		for _, name := range []string{stream, dlq} {
			s, err := js.Stream(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.CachedInfo().Config.Duplicates; got != wantDups {
				t.Errorf("round %d: stream %s Duplicates %s after concurrent first declares, want %s (the longest)", round, name, got, wantDups)
			}
		}
	}
}

// deleteQueue deletes q's streams through a broker of its own.
func deleteQueue(t *testing.T, q string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := jetstream.Connect(ctx, integration.NATSURL(t), jetstream.ConnectOptions{Name: "berth-test-cleanup"}, jetstream.Options{Logger: quiet})
	if err != nil {
		t.Errorf("cleanup connect: %v", err)
		return
	}
	defer c.Close()
	if err := c.DeleteQueue(ctx, q); err != nil {
		t.Errorf("DeleteQueue(%q): %v", q, err)
	}
}
