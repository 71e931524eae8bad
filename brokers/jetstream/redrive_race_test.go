package jetstream_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/sdk"
)

// deadLetters publishes n messages on q and dead-letters them, returning
// their IDs in dead-letter order.
func deadLetters(ctx context.Context, t *testing.T, b *jetstream.Broker, q string, n int) []string {
	t.Helper()
	for i := range n {
		if err := b.Publish(ctx, q, &sdk.Message{Type: fmt.Sprintf("job%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	var ids []string
	for len(ids) < n {
		ds, err := b.Receive(ctx, q, n-len(ids))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			if err := d.DeadLetter(ctx, sdk.Permanent(errors.New("bad"))); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, d.Message().ID)
		}
	}
	return ids
}

// drain receives and acks what q holds ready now, returning the IDs.
func drain(ctx context.Context, t *testing.T, b *jetstream.Broker, q string) []string {
	t.Helper()
	var ids []string
	for {
		ds, err := b.Receive(ctx, q, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 0 {
			return ids
		}
		for _, d := range ds {
			ids = append(ids, d.Message().ID)
			_ = d.Ack(ctx)
		}
	}
}

// racing is the set-up of the race tests: a broker b and a peer (the other
// operator), a new queue q (named after name) with n dead letters, whose IDs
// are returned in dead-letter order. ctx ends with the test, after 60 s at
// most.
func racing(t *testing.T, name string, n int) (ctx context.Context, b, peer *jetstream.Broker, q string, ids []string) {
	t.Helper()
	b, peer = newBroker(t, testOpts), newBroker(t, testOpts)
	q = declare(t, b, name)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx, b, peer, q, deadLetters(ctx, t, b, q, n)
}

// TestRedriveRacingPurge: a dead letter purged while a whole-queue redrive
// has stored its copy but not yet taken it is either redriven or purged,
// never both, and the two counts add up to the letters there were.
func TestRedriveRacingPurge(t *testing.T) {
	ctx, b, peer, q, _ := racing(t, "redrivepurge", 3)
	purged, calls := 0, 0
	defer jetstream.SetRedriveHook(func(uint64) {
		calls++
		if calls == 1 {
			n, err := peer.PurgeDeadLetters(ctx, q)
			if err != nil {
				t.Errorf("PurgeDeadLetters: %v", err)
			}
			purged = n
		}
	})()
	redriven, err := b.RedriveDeadLetters(ctx, q)
	if err != nil {
		t.Errorf("RedriveDeadLetters = %d, %v", redriven, err)
	}
	got := drain(ctx, t, b, q)
	t.Logf("redriven %d, purged %d, back on the queue %d", redriven, purged, len(got))
	if redriven+purged != 3 {
		t.Errorf("redriven %d + purged %d = %d dead letters, want 3: a letter counted twice", redriven, purged, redriven+purged)
	}
	if len(got) != redriven {
		t.Errorf("%d jobs back on the queue, want the %d redriven: a purged letter runs", len(got), redriven)
	}
	if st, err := b.Stats(ctx, q); err != nil || st.DeadLettered != 0 || st.Delayed != 0 || st.Ready != 0 {
		t.Errorf("Stats = %+v, %v; want nothing left", st, err)
	}
}

// TestRedriveRacingDeleteByID: a dead letter deleted by ID while a
// whole-queue redrive has stored its copy is not redriven.
func TestRedriveRacingDeleteByID(t *testing.T) {
	ctx, b, peer, q, ids := racing(t, "redrivedelete", 2)
	deleted, calls := 0, 0
	defer jetstream.SetRedriveHook(func(uint64) {
		calls++
		if calls == 1 {
			n, err := peer.DeleteDeadLetters(ctx, q, ids[0])
			if err != nil {
				t.Errorf("DeleteDeadLetters: %v", err)
			}
			deleted = n
		}
	})()
	redriven, err := b.RedriveDeadLetters(ctx, q)
	if err != nil {
		t.Errorf("RedriveDeadLetters = %d, %v", redriven, err)
	}
	got := drain(ctx, t, b, q)
	if deleted != 1 || redriven != 1 || !slices.Equal(got, ids[1:]) {
		t.Errorf("deleted %d, redriven %d, back on the queue %v; want 1, 1, %v", deleted, redriven, got, ids[1:])
	}
}

// TestPurgeRacingRedrive: a purge counts what it deleted, not a dead letter
// that a redrive took between its reading the stream and its purge.
func TestPurgeRacingRedrive(t *testing.T) {
	ctx, b, peer, q, ids := racing(t, "purgeredrive", 3)
	redriven := 0
	defer jetstream.SetPurgeHook(func() {
		n, err := peer.RedriveDeadLetters(ctx, q, ids[0])
		if err != nil {
			t.Errorf("RedriveDeadLetters: %v", err)
		}
		redriven = n
	})()
	purged, err := b.PurgeDeadLetters(ctx, q)
	if err != nil {
		t.Fatalf("PurgeDeadLetters: %v", err)
	}
	got := drain(ctx, t, b, q)
	if redriven != 1 || purged != 2 || !slices.Equal(got, ids[:1]) {
		t.Errorf("redriven %d, purged %d, back on the queue %v; want 1, 2, %v", redriven, purged, got, ids[:1])
	}
}

// TestRedriveRacingRedrive: two redrives of one dead letter keep a held copy
// each. The one that loses the letter deletes only its own, so the one that
// took it keeps the copy that stands in for the letter until its ready copy
// is stored. (They shared one held copy through its Nats-Msg-Id, and the
// loser's delete took it from the winner: a failure of the winner's ready
// publish then lost the job.) The letter runs once, counted once.
func TestRedriveRacingRedrive(t *testing.T) {
	ctx, b, peer, q, _ := racing(t, "redriveredrive", 1)
	calls, second := 0, 0
	var delayedAfterPeer int64
	defer jetstream.SetRedriveHook(func(uint64) {
		calls++
		if calls != 1 {
			return // the peer's own redrive
		}
		n, err := peer.RedriveDeadLetters(ctx, q)
		if err != nil {
			t.Errorf("the peer's RedriveDeadLetters: %v", err)
		}
		second = n
		st, err := peer.Stats(ctx, q)
		if err != nil {
			t.Errorf("Stats: %v", err)
		}
		delayedAfterPeer = st.Delayed
	})()
	first, err := b.RedriveDeadLetters(ctx, q)
	if err != nil {
		t.Errorf("RedriveDeadLetters: %v", err)
	}
	if delayedAfterPeer != 1 {
		t.Errorf("%d held copies once the peer's redrive ended, want 1: the first redrive's own", delayedAfterPeer)
	}
	got := drain(ctx, t, b, q)
	if first+second != 1 || len(got) != 1 {
		t.Errorf("redriven %d + %d, %d back on the queue; want the letter redriven once and run once", first, second, len(got))
	}
	if st, err := b.Stats(ctx, q); err != nil || st.DeadLettered != 0 || st.Delayed != 0 || st.Ready != 0 {
		t.Errorf("Stats = %+v, %v; want nothing left", st, err)
	}
}
