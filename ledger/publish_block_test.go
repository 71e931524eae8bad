package ledger_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/berthq/berth/ledger"
	"github.com/berthq/berth/sdk"
)

// hangingStore is a Store whose Write says when it starts and then hangs
// until release is closed (or its context ends): a database that does not
// answer.
type hangingStore struct {
	entered chan struct{}
	release chan struct{}
}

func (s *hangingStore) Write(ctx context.Context, _ []ledger.Event) error {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	select {
	case <-s.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// accepting is a publisher that publishes every message.
type accepting struct{}

func (accepting) Publish(context.Context, string, ...*sdk.Message) error { return nil }

// TestPublishBatchWaitsBlockTimeoutInAll: with the ledger's database not
// answering and its buffer full, Publisher's Publish waited BlockTimeout
// for every message of its batch before dropping it: a batch of 200 was
// held up 200 × BlockTimeout (here 200 s; an outbox relay's batch of 100 at
// the default 5ms, half a second, with its rows locked), where recording is
// promised to hold a job up at most BlockTimeout. A Publish waits at most
// BlockTimeout in all, then drops and counts the rest of its batch at once.
func TestPublishBatchWaitsBlockTimeoutInAll(t *testing.T) {
	const block, n = time.Second, 200
	s := &hangingStore{entered: make(chan struct{}, 1), release: make(chan struct{})}
	released := false
	release := func() {
		if !released {
			released = true
			close(s.release)
		}
	}
	defer release()
	l := newLedger(t, s, ledger.Options{Buffer: 1, BatchSize: 1, Linger: -1, BlockTimeout: block, WriteTimeout: time.Hour})
	// The writer takes the first event and hangs writing it; the second
	// fills the buffer.
	l.Record(ledger.Event{MessageID: "first", Status: ledger.StatusEnqueued, At: time.Now()})
	select {
	case <-s.entered:
	case <-time.After(time.Minute):
		t.Fatal("the writer never wrote")
	}
	l.Record(ledger.Event{MessageID: "second", Status: ledger.StatusEnqueued, At: time.Now()})
	if st := l.Stats(); st.Buffered != 1 || st.Dropped != 0 {
		t.Fatalf("stats %+v: want the buffer full, nothing dropped", st)
	}
	msgs := make([]*sdk.Message, n)
	for i := range msgs {
		msgs[i] = &sdk.Message{ID: "m" + strconv.Itoa(i), Type: "t"}
	}
	done := make(chan error, 1)
	go func() { done <- l.Publisher(accepting{}).Publish(context.Background(), "q", msgs...) }()
	// Expected after about one BlockTimeout; a minute is far beyond that
	// on a loaded machine, and far short of n of them.
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Publish: %v", err)
		}
	case <-time.After(time.Minute):
		release() // the writer drains: the Publish ends
		<-done
		t.Fatalf("a Publish of %d messages with the buffer full still ran after a minute: it waits BlockTimeout (%s) per message", n, block)
	}
	if st := l.Stats(); st.Recorded != n+2 || st.Dropped != n {
		t.Errorf("stats %+v: want %d recorded, the batch's %d dropped and counted", st, n+2, n)
	}
	release()
	if err := l.Flush(testCtx(t, time.Minute)); err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st.Written != 2 || st.Dropped != n || st.Failed != 0 {
		t.Errorf("stats %+v: want 2 written, %d dropped", st, n)
	}
}
